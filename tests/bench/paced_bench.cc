// paced_bench — the engine's schedule at the paper's scale, without a GPU: the real controller
// on 8 paced workers (workers/device/paced_device.h) and a data-free store, on the authors'
// per-layer figures (tests/bench/profiles), next to roundpipe-sim on the same partition. Every
// figure is a paced figure: real-time equivalents of sleeps scaled by --time_scale.
//   build/tests/bench/paced_bench [--models qwen3-1.7b,...] [--time_scale 0 (auto)] [--repeats 3]
//       [--iterations 4] [--modes sync,async] [--transfers off,on] [--link_gbps 25] [--stage_cap_gib 11]
// Prints per model, mode and transfer setting: the partition (the simulator's choice), the
// simulated and the engine's iteration time and bubble (the engine's: the median of the repeats,
// with its spread), and their ratio.
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "scheduler/planning/comparison.h"
#include "scheduler/planning/partition.h"
#include "scheduler/planning/presets.h"
#include "scheduler/planning/profile_file.h"
#include "scheduler/runtime/paced_run.h"
#include "tests/support/run_command.h"
#include "workers/device/device.h"
#include "workers/device/test_hooks.h"

ABSL_FLAG(std::string, models, "qwen3-1.7b,llama-3.1-8b,gpt-oss-20b,qwen3-32b,qwen3-235b-a22b",
          "Paper model presets; each needs tests/bench/profiles/<name>.json");
ABSL_FLAG(std::string, profiles_dir, RP_SOURCE_DIR "/tests/bench/profiles", "Where the profiles are");
ABSL_FLAG(double, time_scale, 0,
          "Wall seconds per real second; 0 = per row, about 1.5 s of wall time per simulated iteration "
          "(within [0.05, 0.5]): host work between operations is not scaled, so a small scale magnifies it");
ABSL_FLAG(int, repeats, 3, "Engine runs per row (median reported)");
ABSL_FLAG(int, iterations, 4, "Measured iterations per run (after 2 of warm-up)");
ABSL_FLAG(std::string, modes, "sync,async", "Optimizer modes");
ABSL_FLAG(std::string, transfers, "off,on", "Transfer settings");
ABSL_FLAG(double, link_gbps, 25, "Host link bandwidth per worker, GB/s (with transfers on)");
ABSL_FLAG(int, workers, 8, "N");
ABSL_FLAG(double, stage_cap_gib, 0,
          "Per-stage device memory cap for the partition choice, GiB (11 = an RTX 4090's 24 GB: one stage runs "
          "while the next is prefetched); 0 = none");
ABSL_FLAG(int, microbatches, 16, "M");
ABSL_FLAG(bool, choose_round_size, false,
          "The partition choice also picks the round size M_R among the divisors of M that are >= N (as "
          "roundpipe-sim --round_size -1); false: all micro-batches in one round");

namespace {

using rp::scheduler::runtime::PacedRunOptions;

// A bubble ratio as a percentage, a steady state's rounding residue (-1e-12) printed as 0.00.
double Percent(double ratio) { return std::abs(ratio) < 5e-5 ? 0.0 : 100 * ratio; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

ABSL_FLAG(bool, lose_worker, false,
          "Instead of the table above: per row, the engine without a fault and with one worker lost in the middle "
          "of a measured iteration (at its middle forward slot's middle micro-batch), side by side, and beside each "
          "figure what the simulator predicts (scheduler/planning/lost_worker_sim.h)");

// One row of --lose_worker: the cost of losing a worker mid-iteration, paced.
int LostWorkerRow(PacedRunOptions o, const std::string& row) {
  o.iterations = std::max(o.iterations, 4);
  auto clean = rp::scheduler::runtime::RunPaced(o);
  // Lost at measured iteration 1 (counting from 0 after the warm-up), mid-way through its forward.
  const int lose_iteration = o.warmup + 1;
  const std::string label = absl::StrCat("F", (o.partition.num_forward_stages() + 1) / 2, " mb", o.microbatches / 2);
  std::atomic<bool> fired{false};
  const rp::workers::FaultHook hook = [&](int, const rp::workers::OpInfo& op) {
    const bool here = op.iteration == lose_iteration && op.label == label && !fired.exchange(true);
    return here ? rp::workers::Fault::kDeviceLost : rp::workers::Fault::kNone;
  };
  rp::workers::SetFaultHook(&hook);
  auto lost = rp::scheduler::runtime::RunPaced(o);
  rp::workers::SetFaultHook(nullptr);
  if (!clean.ok() || !lost.ok() || !fired) {
    std::fprintf(stderr, "%s: %s %s%s\n", row.c_str(), std::string(clean.status().message()).c_str(),
                 std::string(lost.status().message()).c_str(), fired ? "" : " (the fault never fired)");
    return 1;
  }
  rp::planning::LostWorkerFault fault;
  fault.iteration = lose_iteration;
  fault.slot_in_round = (o.partition.num_forward_stages() + 1) / 2 - 1;
  fault.microbatch = o.microbatches / 2;
  auto sim = rp::scheduler::runtime::SimulatePacedLoss(o, fault);
  if (!sim.ok()) {
    std::fprintf(stderr, "%s: %s\n", row.c_str(), std::string(sim.status().message()).c_str());
    return 1;
  }
  // Measured iteration 1 is the one with the loss; the ones after it run on N-1 workers.
  auto after = [](const std::vector<double>& p) {
    double sum = 0;
    for (size_t i = 2; i < p.size(); ++i) sum += p[i] / static_cast<double>(p.size() - 2);
    return sum;
  };
  const auto &a = clean->iteration_period_s, &b = lost->iteration_period_s;
  const auto &sa = sim->clean_period_s, &sb = sim->lost_period_s;
  std::printf("%-30s %-8s %8.1f %8.1f %8.1f %8.1f %+8.1f %+8.1f %8.1f %8.1f %7.3f %7.3f\n", row.c_str(), label.c_str(),
              a[1] * 1e3, sa[1] * 1e3, b[1] * 1e3, sb[1] * 1e3, (b[1] - a[1]) * 1e3, (sb[1] - sa[1]) * 1e3,
              after(b) * 1e3, after(sb) * 1e3, b[1] / sb[1], after(b) / after(sb));
  std::fflush(stdout);
  return 0;
}

// One row's run options: the model on the partition the simulator picks for the mode (its
// candidates simulated), the time scale chosen from the simulated period unless given.
absl::StatusOr<PacedRunOptions> RowOptions(const rp::planning::Profile& profile, const rp::spec::ModelConfig& cfg,
                                           bool async, bool transfers) {
  PacedRunOptions o;
  o.profile = profile;
  o.model = cfg;
  o.workers = absl::GetFlag(FLAGS_workers);
  o.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.async = async;
  o.transfers = transfers;
  o.link_bytes_per_s = absl::GetFlag(FLAGS_link_gbps) * 1e9;
  const double flag_scale = absl::GetFlag(FLAGS_time_scale);
  o.time_scale = flag_scale > 0 ? flag_scale : 0.2;  // auto: chosen below from the simulated period
  o.iterations = absl::GetFlag(FLAGS_iterations);
  auto part = rp::scheduler::runtime::ChoosePacedPartition(
      o, static_cast<int64_t>(absl::GetFlag(FLAGS_stage_cap_gib) * (1 << 30)), absl::GetFlag(FLAGS_choose_round_size));
  if (!part.ok()) return part.status();
  o.partition = part->partition;
  o.microbatches_per_round = part->microbatches_per_round;
  if (flag_scale <= 0) {
    auto sim = rp::scheduler::runtime::SimulatePaced(o);
    if (!sim.ok()) return sim.status();
    o.time_scale = std::clamp(1.5 / sim->period_s, 0.05, 0.5);
  }
  return o;
}

// One row of the table: the engine's median of --repeats runs beside the simulator.
absl::Status TableRow(const PacedRunOptions& o, const std::string& model, absl::string_view mode,
                      absl::string_view xfer) {
  auto sim = rp::scheduler::runtime::SimulatePaced(o);
  if (!sim.ok()) return sim.status();
  std::vector<double> periods, bubbles;
  double wall = 0;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    auto run = rp::scheduler::runtime::RunPaced(o);
    if (!run.ok()) return run.status();
    periods.push_back(run->period_s);
    bubbles.push_back(run->bubble);
    wall += run->wall_s;
  }
  const double med = Median(periods);
  const double spread =
      (*std::max_element(periods.begin(), periods.end()) - *std::min_element(periods.begin(), periods.end())) / med;
  std::printf("%-16s %-5s %-4s %-28s %6.3f %10.1f %10.1f %7.1f%% %8.3f %7.2f%% %6.2f%% %7.1f\n", model.c_str(),
              std::string(mode).c_str(), std::string(xfer).c_str(),
              (o.microbatches_per_round > 0 ? absl::StrCat("M_R=", o.microbatches_per_round, " ") : std::string())
                  .append(o.partition.ToString())
                  .substr(0, 28)
                  .c_str(),
              o.time_scale, sim->period_s * 1e3, med * 1e3, 100 * spread, med / sim->period_s, Percent(sim->bubble),
              100 * Median(bubbles), wall);
  std::fflush(stdout);
  return absl::OkStatus();
}

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), std::string(s.message()).c_str());
  return 1;
}

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The host work of a paced run is small; LibTorch's spinning intra-op threads would only take
  // the cores from the 40 stream threads whose wake-ups make the schedule.
  at::set_num_threads(1);
  std::printf("paced engine vs roundpipe-sim, N=%d M=%d (all figures paced: real-time equivalents of scaled sleeps)\n",
              absl::GetFlag(FLAGS_workers), absl::GetFlag(FLAGS_microbatches));
  if (absl::GetFlag(FLAGS_lose_worker)) {
    std::printf("%-30s %-8s %8s %8s %8s %8s %8s %8s %8s %8s %7s %7s\n", "model mode xfer", "lost at", "clean ms", "sim",
                "lost ms", "sim", "cost ms", "sim", "N-1 ms", "sim", "lost/s", "N-1/s");
  } else {
    std::printf("%-16s %-5s %-4s %-28s %6s %10s %10s %8s %8s %8s %7s %7s\n", "model", "mode", "xfer", "partition",
                "scale", "sim ms", "engine ms", "spread", "ratio", "sim bub", "eng bub", "wall s");
  }
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_models), ',')) {
    const std::string model(name);
    auto profile = rp::planning::ParseProfile(
        rp::testing::ReadWholeFile(absl::GetFlag(FLAGS_profiles_dir) + "/" + model + ".json"));
    if (!profile.ok()) return Fail(model, profile.status());
    auto preset = rp::planning::ModelPreset(model);
    if (!preset.ok()) return Fail(model, preset.status());
    if (absl::Status valid = preset->Validate(); !valid.ok()) return Fail(model, valid);
    for (absl::string_view mode : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',')) {
      for (absl::string_view xfer : absl::StrSplit(absl::GetFlag(FLAGS_transfers), ',')) {
        auto o = RowOptions(*profile, *preset, mode == "async", xfer == "on");
        if (!o.ok()) return Fail(model, o.status());
        if (absl::GetFlag(FLAGS_lose_worker)) {
          if (LostWorkerRow(*o, absl::StrCat(model, " ", mode, " ", xfer)) != 0) return 1;
          continue;
        }
        if (absl::Status st = TableRow(*o, model, mode, xfer); !st.ok()) return Fail(model, st);
      }
    }
  }
  return 0;
}
