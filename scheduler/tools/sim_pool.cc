#include "scheduler/tools/sim_pool.h"

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/pool_simulator.h"
#include "scheduler/planning/schedules.h"
#include "scheduler/planning/simulator.h"

namespace rp::planning {
namespace {

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "roundpipe-sim: %s\n", std::string(st.message()).c_str());
  return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

absl::StatusOr<std::vector<double>> ParseDoubles(const std::string& flag, const std::string& s, size_t want) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    double v;
    if (!absl::SimpleAtod(part, &v) || !(v >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", part, "' is not a number >= 0"));
    }
    out.push_back(v);
  }
  if (!out.empty() && out.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", out.size(), " values for ", want, " jobs"));
  }
  return out;
}

// The RoundPipe plan of one job: --partition, or the partition the simulator picks for its mode.
absl::StatusOr<DispatchPlan> JobPlan(const CostModel& costs, const ComparisonOptions& o, OptimizerMode mode,
                                     int iterations) {
  DispatchOptions d;
  d.num_workers = o.num_workers;
  d.microbatches_per_iteration = o.num_microbatches;
  d.microbatches_per_round = o.microbatches_per_round;
  d.iterations = iterations;
  d.mode = mode;
  Partition p;
  if (o.user_partition) {
    p = *o.user_partition;
  } else {
    PartitionProblem problem{&costs, o.num_workers, o.num_microbatches, o.stage_memory_cap};
    SimulatedChoice choice;
    choice.mode = mode;
    choice.choose_round_size = o.choose_round_size;
    choice.microbatches_per_round = o.microbatches_per_round;
    choice.sim = o.sim;
    auto part = SimulatedBestPartition(problem, choice);
    if (!part.ok()) return part.status();
    p = part->partition;
    if (o.choose_round_size) d.microbatches_per_round = part->microbatches_per_round;
  }
  return BuildDispatchPlan(p, costs.num_layers(), d);
}

}  // namespace

absl::StatusOr<std::vector<PoolJobFlags>> ParsePoolFlags(const std::string& modes, const std::string& shares,
                                                         const std::string& starts) {
  std::vector<PoolJobFlags> jobs;
  for (absl::string_view m : absl::StrSplit(modes, ',', absl::SkipEmpty())) {
    if (m != "sync" && m != "async") {
      return absl::InvalidArgumentError(absl::StrCat("--pool: '", m, "' is not sync or async"));
    }
    jobs.push_back({m == "sync" ? OptimizerMode::kSync : OptimizerMode::kAsync});
  }
  if (jobs.empty() || jobs.size() > 16) return absl::InvalidArgumentError("--pool: list 1 to 16 jobs (sync or async)");
  auto sh = ParseDoubles("--pool_shares", shares, jobs.size());
  if (!sh.ok()) return sh.status();
  auto st = ParseDoubles("--pool_starts_s", starts, jobs.size());
  if (!st.ok()) return st.status();
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (!sh->empty()) jobs[j].share = (*sh)[j];
    if (!st->empty()) jobs[j].start_s = (*st)[j];
    if (!(jobs[j].share > 0 && jobs[j].share <= 1000)) {
      return absl::InvalidArgumentError("--pool_shares: a share is in (0, 1000]");
    }
  }
  return jobs;
}

absl::StatusOr<LostWorkerFault> ParseLostWorkerFlag(const std::string& spec) {
  std::vector<int> v;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    int x;
    if (!absl::SimpleAtoi(part, &x) || x < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lose_worker: '", spec, "' is not ITERATION,SLOT,MICROBATCH (integers >= 0)"));
    }
    v.push_back(x);
  }
  if (v.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("--lose_worker: '", spec, "' is not ITERATION,SLOT,MICROBATCH"));
  }
  return LostWorkerFault{v[0], v[1], v[2]};
}

int RunPool(const CostModel& costs, const ComparisonOptions& o, const std::vector<PoolJobFlags>& flags) {
  std::vector<PoolSimJob> jobs;
  for (const PoolJobFlags& f : flags) {
    auto plan = JobPlan(costs, o, f.mode, o.iterations);
    if (!plan.ok()) return Fail(plan.status());
    auto s = RoundPipeSchedule(*plan, costs, o.sim);
    if (!s.ok()) return Fail(s.status());
    jobs.push_back({*std::move(s), f.share, f.start_s, f.mode == OptimizerMode::kAsync});
  }
  auto together = SimulatePool(jobs);
  if (!together.ok()) return Fail(together.status());
  std::printf("%zu jobs of %d iterations side by side on N=%d workers (M=%d)\n", jobs.size(), o.iterations,
              o.num_workers, o.num_microbatches);
  std::printf("%-4s %-6s %6s %9s %9s %9s %11s\n", "job", "mode", "share", "start s", "end s", "alone s", "compute %");
  double serial = 0, compute = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    PoolSimJob alone = jobs[j];
    alone.start_s = 0;
    auto a = SimulatePool({alone});
    if (!a.ok()) return Fail(a.status());
    serial += a->makespan_s;
    compute += a->jobs.front().compute_s;
    std::printf("%-4zu %-6s %6.2f %9.3f %9.3f %9.3f %10.1f%%\n", j, OptimizerModeName(flags[j].mode), flags[j].share,
                flags[j].start_s, together->jobs[j].end_s, a->makespan_s, 100 * together->compute_split[j]);
  }
  std::printf("together %.3f s (utilisation %.1f%%); one after another %.3f s (%.1f%%); ratio %.3f\n",
              together->makespan_s, 100 * together->utilisation, serial, 100 * compute / (o.num_workers * serial),
              together->makespan_s / serial);
  std::printf("(compute %%: each job's part of the pool's compute until the first job ended)\n");
  return 0;
}

int RunLostWorker(const CostModel& costs, const ComparisonOptions& o, OptimizerMode mode,
                  const LostWorkerFault& fault) {
  auto plan = JobPlan(costs, o, mode, o.iterations);
  if (!plan.ok()) return Fail(plan.status());
  auto clean_s = RoundPipeSchedule(*plan, costs, o.sim);
  if (!clean_s.ok()) return Fail(clean_s.status());
  auto clean = Simulate(*clean_s);
  if (!clean.ok()) return Fail(clean.status());
  auto lost = SimulateLostWorker(plan->partition, costs, plan->options, o.sim, fault);
  if (!lost.ok()) return Fail(lost.status());
  std::printf("RoundPipe-%s %s on N=%d, M=%d: worker %d lost at %.3f s (iteration %d, slot %d, micro-batch %d)\n",
              OptimizerModeName(mode), plan->partition.ToString().c_str(), o.num_workers, o.num_microbatches,
              lost->lost_worker, lost->lost_at_s, fault.iteration, fault.slot_in_round, fault.microbatch);
  std::printf("%d stage slots ran again on the survivors; iterations after %d planned over %d workers\n",
              lost->slots_rerun, lost->last_iteration_before, o.num_workers - 1);
  std::printf("%-9s %12s %12s %12s %12s\n", "iteration", "clean end s", "lost end s", "clean ms", "lost ms");
  for (size_t k = 0; k < lost->iteration_end.size(); ++k) {
    const double c0 = k > 0 ? clean->iteration_end[k - 1] : 0, l0 = k > 0 ? lost->iteration_end[k - 1] : 0;
    std::printf("%-9zu %12.3f %12.3f %12.1f %12.1f\n", k, clean->iteration_end[k], lost->iteration_end[k],
                (clean->iteration_end[k] - c0) * 1e3, (lost->iteration_end[k] - l0) * 1e3);
  }
  return 0;
}

}  // namespace rp::planning
