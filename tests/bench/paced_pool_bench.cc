// paced_pool_bench — jobs side by side on one pool of 8 paced workers (the engine's lanes and
// compute gates, scheduler/runtime/paced_pool.h) against the same jobs one after another, on the
// authors' per-layer figures (tests/bench/profiles): makespan, compute utilisation; and how the
// compute splits between two jobs by their shares while both run; beside each figure, what the
// pool simulator predicts (scheduler/planning/pool_simulator.h). Paced figures only.
//   build/tests/bench/paced_pool_bench [--time_scale 0.2] [--iterations 6] [--shares_only] [--iteration_ends]
#include <ATen/Parallel.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/planning/comparison.h"
#include "scheduler/planning/partition.h"
#include "scheduler/planning/presets.h"
#include "scheduler/planning/profile_file.h"
#include "scheduler/runtime/paced_pool.h"
#include "tests/support/run_command.h"

ABSL_FLAG(std::string, profiles_dir, RP_SOURCE_DIR "/tests/bench/profiles", "Where the profiles are");
ABSL_FLAG(double, time_scale, 0.2, "Wall seconds per real second");
ABSL_FLAG(int, iterations, 6, "Iterations per job (after 2 of warm-up)");
ABSL_FLAG(bool, shares_only, false, "Only the share split (skip the side-by-side vs serial table)");
ABSL_FLAG(bool, iteration_ends, false, "Also print when each job's iterations ended, engine and simulator");

namespace {

using rp::scheduler::runtime::PacedPoolJob;
using rp::scheduler::runtime::PacedPoolOptions;
using rp::scheduler::runtime::PacedPoolResult;
using rp::scheduler::runtime::PacedRunOptions;

// A paper model's job on 8 workers, M = 16, on the partition the simulator picks for its mode.
absl::StatusOr<PacedRunOptions> Job(const std::string& model, bool async) {
  auto profile =
      rp::planning::ParseProfile(rp::testing::ReadWholeFile(absl::GetFlag(FLAGS_profiles_dir) + "/" + model + ".json"));
  if (!profile.ok()) return profile.status();
  auto preset = rp::planning::ModelPreset(model);
  if (!preset.ok()) return preset.status();
  PacedRunOptions o;
  o.profile = *profile;
  o.model = *preset;
  o.async = async;
  o.time_scale = absl::GetFlag(FLAGS_time_scale);
  o.iterations = absl::GetFlag(FLAGS_iterations);
  auto part = rp::scheduler::runtime::ChoosePacedPartition(o, /*stage_cap_bytes=*/0);
  if (!part.ok()) return part.status();
  o.partition = part->partition;
  return o;
}

struct Named {
  std::string name;
  PacedRunOptions run;
  double share = 1;
  double start_s = 0;
};

PacedPoolOptions Options(const std::vector<Named>& jobs, bool side_by_side) {
  PacedPoolOptions o;
  o.side_by_side = side_by_side;
  for (const Named& j : jobs) o.jobs.push_back({j.run, j.share, j.start_s});
  return o;
}

// The engine's run and the pool simulator's prediction of it.
struct Measured {
  PacedPoolResult engine, sim;
};

absl::StatusOr<Measured> Run(const std::vector<Named>& jobs, bool side_by_side) {
  const PacedPoolOptions o = Options(jobs, side_by_side);
  auto engine = rp::scheduler::runtime::RunPacedPool(o);
  if (!engine.ok()) return engine.status();
  auto sim = rp::scheduler::runtime::SimulatePacedPool(o);
  if (!sim.ok()) return sim.status();
  return Measured{*std::move(engine), *std::move(sim)};
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "paced_pool_bench: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  at::set_num_threads(1);  // the stream threads' wake-ups make the schedule (see paced_bench)
  auto q_sync = Job("qwen3-1.7b", false), q_async = Job("qwen3-1.7b", true), l_sync = Job("llama-3.1-8b", false);
  for (const auto* j : {&q_sync, &q_async, &l_sync}) {
    if (!j->ok()) return Fail(j->status());
  }
  std::printf(
      "jobs side by side vs one after another, N=8 M=16, %d iterations each after 2 of warm-up, time "
      "scale %.2f (paced: real-time equivalents)\n",
      absl::GetFlag(FLAGS_iterations), absl::GetFlag(FLAGS_time_scale));
  std::printf("%-40s %9s %9s %9s %9s %7s %7s %9s %9s %7s\n", "jobs", "serial s", "sim", "tog. s", "sim", "eng/sim",
              "ratio", "sim", "util tog", "sim");
  const std::vector<std::vector<Named>> mixes = {
      {{"qwen3-1.7b sync", *q_sync}, {"qwen3-1.7b sync", *q_sync}},
      {{"qwen3-1.7b sync", *q_sync}, {"qwen3-1.7b sync 1 s later", *q_sync, 1, 1.0}},
      {{"qwen3-1.7b async", *q_async}, {"qwen3-1.7b async", *q_async}},
      {{"qwen3-1.7b sync", *q_sync}, {"llama-3.1-8b sync", *l_sync}},
      {{"qwen3-1.7b sync", *q_sync}, {"qwen3-1.7b async", *q_async}, {"llama-3.1-8b sync", *l_sync}},
  };
  for (const auto& mix : absl::GetFlag(FLAGS_shares_only) ? std::vector<std::vector<Named>>{} : mixes) {
    auto serial = Run(mix, false);
    if (!serial.ok()) return Fail(serial.status());
    auto together = Run(mix, true);
    if (!together.ok()) return Fail(together.status());
    std::vector<std::string> names;
    for (const Named& j : mix) names.push_back(j.name);
    const PacedPoolResult &se = serial->engine, &ss = serial->sim, &te = together->engine, &ts = together->sim;
    std::printf("%-40s %9.1f %9.1f %9.1f %9.1f %7.3f %7.3f %9.3f %8.1f%% %6.1f%%\n",
                absl::StrJoin(names, " + ").c_str(), se.makespan_s, ss.makespan_s, te.makespan_s, ts.makespan_s,
                te.makespan_s / ts.makespan_s, te.makespan_s / se.makespan_s, ts.makespan_s / ss.makespan_s,
                100 * te.utilisation, 100 * ts.utilisation);
    if (absl::GetFlag(FLAGS_iteration_ends)) {
      for (size_t j = 0; j < mix.size(); ++j) {
        std::printf("  job %zu engine:", j);
        for (double e : te.iteration_end_s[j]) std::printf(" %.2f", e);
        std::printf("\n  job %zu sim:   ", j);
        for (double e : ts.iteration_end_s[j]) std::printf(" %.2f", e);
        std::printf("\n");
      }
    }
    std::fflush(stdout);
  }
  std::printf("\nshares: two qwen3-1.7b sync jobs side by side, until the first one ends (engine | simulator)\n");
  std::printf("%-8s %10s %10s %8s %10s %10s %10s %10s\n", "shares", "compute A", "sim", "want A", "iter/s A", "sim",
              "iter/s B", "sim");
  for (double share_a : {1.0, 3.0}) {
    std::vector<Named> mix = {{"A", *q_sync, share_a}, {"B", *q_sync, 1}};
    auto r = Run(mix, true);
    if (!r.ok()) return Fail(r.status());
    const PacedPoolResult &e = r->engine, &m = r->sim;
    std::printf("%-8s %9.1f%% %9.1f%% %7.1f%% %10.3f %10.3f %10.3f %10.3f\n", absl::StrCat(share_a, ":1").c_str(),
                100 * e.compute_split[0], 100 * m.compute_split[0], 100 * share_a / (share_a + 1),
                e.iterations_per_s[0], m.iterations_per_s[0], e.iterations_per_s[1], m.iterations_per_s[1]);
    std::fflush(stdout);
  }
  return 0;
}
