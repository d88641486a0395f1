#include "scheduler/planning/comparison.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/planning/dispatch_plan.h"

namespace rp::planning {
namespace {

absl::StatusOr<ComparisonRow> Finish(ComparisonRow row, const SimSchedule& with_opt, const SimSchedule& without_opt) {
  auto b = AnalyzeBubbles(with_opt, without_opt);
  if (!b.ok()) return b.status();
  auto r = Simulate(with_opt);
  if (!r.ok()) return r.status();
  row.bubbles = *b;
  row.schedule_data = with_opt;
  row.result = *std::move(r);
  return row;
}

absl::StatusOr<ComparisonRow> RunRoundPipe(const CostModel& costs, const ComparisonOptions& o, OptimizerMode mode) {
  PartitionProblem pr{&costs, o.num_workers, o.num_microbatches, o.stage_memory_cap};
  absl::StatusOr<PartitionResult> part = o.user_partition          ? EvaluatePartition(pr, *o.user_partition)
                                         : o.fixed_stage_count > 0 ? PartitionWithStageCount(pr, o.fixed_stage_count)
                                                                   : AutoPartition(pr);
  if (!part.ok()) return part.status();
  DispatchOptions d;
  d.num_workers = o.num_workers;
  d.microbatches_per_iteration = o.num_microbatches;
  d.microbatches_per_round = o.microbatches_per_round;
  d.iterations = o.iterations;
  d.mode = mode;
  auto plan = BuildDispatchPlan(part->partition, costs.num_layers(), d);
  if (!plan.ok()) return plan.status();
  auto with_opt = RoundPipeSchedule(*plan, costs, o.sim);
  if (!with_opt.ok()) return with_opt.status();
  SimOptions no_opt = o.sim;
  no_opt.optimizer_s_per_layer = 0;
  auto without_opt = RoundPipeSchedule(*plan, costs, no_opt);
  if (!without_opt.ok()) return without_opt.status();
  ComparisonRow row;
  row.schedule = with_opt->name;
  row.stages = part->partition.num_stages();
  row.partition = part->partition.ToString();
  row.t_max_s = part->t_max;
  return Finish(std::move(row), *with_opt, *without_opt);
}

absl::StatusOr<ComparisonRow> RunBaseline(const CostModel& costs, const ComparisonOptions& o, Baseline kind, int v) {
  // Baselines are planned without the memory cap, as in the paper's simulator (it favours them).
  BaselineOptions bo{o.num_workers, o.num_microbatches, o.iterations, v, 0};
  std::vector<int> layers;
  auto with_opt = BaselineSchedule(kind, costs, bo, o.sim, &layers);
  if (!with_opt.ok()) return with_opt.status();
  SimOptions no_opt = o.sim;
  no_opt.optimizer_s_per_layer = 0;
  auto without_opt = BaselineSchedule(kind, costs, bo, no_opt);
  if (!without_opt.ok()) return without_opt.status();
  ComparisonRow row;
  row.schedule = with_opt->name;
  row.stages = static_cast<int>(layers.size());
  row.partition = absl::StrCat("[", absl::StrJoin(layers, ","), "]");
  int first = 0;
  for (int n : layers) {
    double t = 0;
    for (int l = first; l < first + n; ++l)
      t += costs.layers[static_cast<size_t>(l)].fwd_s + costs.layers[static_cast<size_t>(l)].bwd_s;
    row.t_max_s = std::max(row.t_max_s, t);
    first += n;
  }
  return Finish(std::move(row), *with_opt, *without_opt);
}

// Looped baselines: the chunk count v that gives the shortest steady-state iteration.
absl::StatusOr<ComparisonRow> RunLooped(const CostModel& costs, const ComparisonOptions& o, Baseline kind) {
  const int vmax_layers = costs.num_layers() / o.num_workers;
  const int vmax = o.max_chunks_per_worker > 0 ? std::min(o.max_chunks_per_worker, vmax_layers) : vmax_layers;
  std::optional<ComparisonRow> best;
  absl::Status last =
      absl::InvalidArgumentError(absl::StrCat(BaselineName(kind), ": needs at least 2 layers per worker (",
                                              costs.num_layers(), " layers, ", o.num_workers, " workers)"));
  for (int v = 2; v <= vmax; ++v) {
    BaselineOptions bo{o.num_workers, o.num_microbatches, o.iterations, v, 0};
    auto s = BaselineSchedule(kind, costs, bo, o.sim);
    if (!s.ok()) {
      last = s.status();
      continue;
    }
    auto r = Simulate(*s);
    if (!r.ok()) return r.status();
    if (!best || r->period < best->bubbles.period_s) {
      auto row = RunBaseline(costs, o, kind, v);
      if (!row.ok()) return row.status();
      best = *std::move(row);
    }
  }
  if (!best) return last;
  return *std::move(best);
}

}  // namespace

absl::StatusOr<std::vector<ComparisonRow>> CompareSchedules(const CostModel& costs, const ComparisonOptions& o) {
  std::vector<ComparisonRow> rows;
  for (const std::string& id : o.schedules) {
    absl::StatusOr<ComparisonRow> row;
    if (id == "gpipe") {
      row = RunBaseline(costs, o, Baseline::kGPipe, 1);
    } else if (id == "1f1b") {
      row = RunBaseline(costs, o, Baseline::k1F1B, 1);
    } else if (id == "interleaved-1f1b") {
      row = RunLooped(costs, o, Baseline::kInterleaved1F1B);
    } else if (id == "looped-bfs") {
      row = RunLooped(costs, o, Baseline::kLoopedBFS);
    } else if (id == "roundpipe-sync") {
      row = RunRoundPipe(costs, o, OptimizerMode::kSync);
    } else if (id == "roundpipe-async") {
      row = RunRoundPipe(costs, o, OptimizerMode::kAsync);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown schedule '", id, "'; known: ", absl::StrJoin(AllScheduleIds(), ", ")));
    }
    if (!row.ok()) {
      return absl::Status(row.status().code(), absl::StrCat(id, ": ", row.status().message()));
    }
    rows.push_back(*std::move(row));
  }
  return rows;
}

}  // namespace rp::planning
