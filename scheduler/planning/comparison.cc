#include "scheduler/planning/comparison.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/planning/dispatch_plan.h"

namespace rp::planning {
namespace {

// Fills the bubble breakdown (steady state) and the schedule/result for Gantt and trace output.
absl::StatusOr<ComparisonRow> Finish(ComparisonRow row, const ScheduleBuilder& build, int iterations) {
  auto b = AnalyzeBubbles(build, iterations);
  if (!b.ok()) return b.status();
  auto s = build(iterations, true);
  if (!s.ok()) return s.status();
  auto r = Simulate(*s);
  if (!r.ok()) return r.status();
  row.bubbles = *b;
  row.schedule_data = *std::move(s);
  row.result = *std::move(r);
  return row;
}

SimOptions WithOptimizer(const SimOptions& o, bool with_optimizer) {
  SimOptions out = o;
  if (!with_optimizer) out.optimizer_s_per_layer = 0;
  return out;
}

// One RoundPipe configuration as a schedule builder: the partition's dispatch plan for `workers`
// workers and `microbatches` micro-batches in rounds of `round` (0 = one round), simulated with
// `sim` (its optimizer time only when the builder is asked for it).
ScheduleBuilder RoundPipeBuilder(const CostModel& costs, Partition partition, int workers, int microbatches, int round,
                                 OptimizerMode mode, SimOptions sim) {
  return [&costs, partition = std::move(partition), workers, microbatches, round, mode, sim = std::move(sim)](
             int iterations, bool with_opt) -> absl::StatusOr<SimSchedule> {
    DispatchOptions d;
    d.num_workers = workers;
    d.microbatches_per_iteration = microbatches;
    d.microbatches_per_round = round;
    d.iterations = iterations;
    d.mode = mode;
    auto plan = BuildDispatchPlan(partition, costs.num_layers(), d);
    if (!plan.ok()) return plan.status();
    return RoundPipeSchedule(*plan, costs, WithOptimizer(sim, with_opt));
  };
}

absl::StatusOr<ComparisonRow> RunRoundPipe(const CostModel& costs, const ComparisonOptions& o, OptimizerMode mode) {
  PartitionProblem pr{&costs, o.num_workers, o.num_microbatches, o.stage_memory_cap};
  pr.min_stages = o.min_stages;
  pr.t_max_window = o.t_max_window;
  SimulatedChoice choice;
  choice.microbatches_per_round = o.microbatches_per_round;
  choice.choose_round_size = o.choose_round_size && o.partition_by_simulation;
  choice.mode = mode;
  choice.sim = WithOptimizer(o.sim, false);
  absl::StatusOr<PartitionResult> part = o.user_partition            ? EvaluatePartition(pr, *o.user_partition)
                                         : o.fixed_stage_count > 0   ? PartitionWithStageCount(pr, o.fixed_stage_count)
                                         : o.partition_by_simulation ? SimulatedBestPartition(pr, choice)
                                                                     : AutoPartition(pr);
  if (!part.ok()) return part.status();
  const Partition partition = part->partition;
  const int round = choice.choose_round_size ? part->microbatches_per_round : o.microbatches_per_round;
  const ScheduleBuilder build =
      RoundPipeBuilder(costs, partition, o.num_workers, o.num_microbatches, round, mode, o.sim);
  ComparisonRow row;
  row.schedule = absl::StrCat("RoundPipe-", OptimizerModeName(mode));
  row.stages = partition.num_stages();
  row.partition = partition.ToString();
  if (choice.choose_round_size) row.partition += absl::StrCat(" M_R=", round > 0 ? round : o.num_microbatches);
  row.t_max_s = part->t_max;
  const int k = SteadyStateIterations(partition, o.num_workers, o.num_microbatches, round, o.iterations);
  return Finish(std::move(row), build, k);
}

// The user's baseline partition when it has v*N stages, else none (min-max).
std::vector<int> BlocksFor(const ComparisonOptions& o, int v) {
  return static_cast<int>(o.baseline_blocks_per_stage.size()) == v * o.num_workers ? o.baseline_blocks_per_stage
                                                                                   : std::vector<int>();
}

ScheduleBuilder BaselineBuilder(const CostModel& costs, const ComparisonOptions& o, Baseline kind, int v) {
  return [&costs, &o, kind, v](int iterations, bool with_opt) -> absl::StatusOr<SimSchedule> {
    // Baselines are planned without the memory cap, as in the paper's simulator (favours them).
    BaselineOptions bo{o.num_workers, o.num_microbatches, iterations, v, 0, BlocksFor(o, v)};
    return BaselineSchedule(kind, costs, bo, WithOptimizer(o.sim, with_opt));
  };
}

absl::StatusOr<ComparisonRow> RunBaseline(const CostModel& costs, const ComparisonOptions& o, Baseline kind, int v) {
  std::vector<int> layers;
  BaselineOptions bo{o.num_workers, o.num_microbatches, 1, v, 0, BlocksFor(o, v)};
  auto probe = BaselineSchedule(kind, costs, bo, o.sim, &layers);
  if (!probe.ok()) return probe.status();
  ComparisonRow row;
  row.schedule = probe->name;
  row.stages = static_cast<int>(layers.size());
  row.partition = absl::StrCat("[", absl::StrJoin(layers, ","), "]");
  int first = 0;
  for (int n : layers) {
    double t = 0;
    for (int l = first; l < first + n; ++l) {
      t += costs.layers[static_cast<size_t>(l)].fwd_s + costs.layers[static_cast<size_t>(l)].bwd_s;
    }
    row.t_max_s = std::max(row.t_max_s, t);
    first += n;
  }
  return Finish(std::move(row), BaselineBuilder(costs, o, kind, v), o.iterations);
}

// Looped baselines: the chunk count v that gives the shortest steady-state iteration.
absl::StatusOr<ComparisonRow> RunLooped(const CostModel& costs, const ComparisonOptions& o, Baseline kind) {
  const int given = static_cast<int>(o.baseline_blocks_per_stage.size());
  if (given > o.num_workers && given % o.num_workers == 0) {  // the user's partition fixes v
    return RunBaseline(costs, o, kind, given / o.num_workers);
  }
  const int vmax_layers = costs.num_layers() / o.num_workers;
  const int vmax = o.max_chunks_per_worker > 0 ? std::min(o.max_chunks_per_worker, vmax_layers) : vmax_layers;
  int best_v = 0;
  double best_period = 0;
  absl::Status last =
      absl::InvalidArgumentError(absl::StrCat(BaselineName(kind), ": needs at least 2 layers per worker (",
                                              costs.num_layers(), " layers, ", o.num_workers, " workers)"));
  for (int v = 2; v <= vmax; ++v) {
    auto st = MeasureSteadyState(BaselineBuilder(costs, o, kind, v), o.iterations, true, false);
    if (!st.ok()) {
      last = st.status();
      continue;
    }
    if (best_v == 0 || st->period_s < best_period) {
      best_v = v;
      best_period = st->period_s;
    }
  }
  if (best_v == 0) return last;
  return RunBaseline(costs, o, kind, best_v);
}

}  // namespace

int SteadyStateIterations(const Partition& p, int num_workers, int microbatches, int microbatches_per_round,
                          int iterations) {
  const int M_R = microbatches_per_round > 0 ? microbatches_per_round : microbatches;
  const int shift = (p.num_stages() * (microbatches / std::max(1, M_R))) % num_workers;
  const int cycle = num_workers / std::gcd(shift, num_workers);
  return (std::max(1, iterations) + cycle - 1) / cycle * cycle;
}

absl::StatusOr<PartitionResult> SimulatedBestPartition(const PartitionProblem& pr, int microbatches_per_round,
                                                       OptimizerMode mode, int max_candidates) {
  SimulatedChoice c;
  c.microbatches_per_round = microbatches_per_round;
  c.mode = mode;
  c.max_candidates = max_candidates;
  c.per_stage_count = 0;
  c.balanced_twins = false;
  return SimulatedBestPartition(pr, c);
}

namespace {

// The round sizes to try: the one asked for, or with choose_round_size every divisor of M that is
// at least N (M itself as 0, the default's spelling).
std::vector<int> RoundSizes(const PartitionProblem& pr, const SimulatedChoice& choice) {
  if (!choice.choose_round_size) return {choice.microbatches_per_round};
  std::vector<int> out = {0};
  for (int d = pr.num_workers; d < pr.num_microbatches; ++d) {
    if (d > 0 && pr.num_microbatches % d == 0) out.push_back(d);
  }
  return out;
}

// The candidate (and round size) whose simulated steady state is fastest; the first in objective
// order among equals, all micro-batches in one round among equals.
absl::StatusOr<PartitionResult> SimulateCandidates(const PartitionProblem& pr, const SimulatedChoice& choice,
                                                   const std::vector<PartitionResult>& cands) {
  const OptimizerMode mode = choice.mode;
  std::optional<PartitionResult> best;
  double best_period = 0;
  for (const int round : RoundSizes(pr, choice)) {
    for (const PartitionResult& c : cands) {
      const ScheduleBuilder build =
          RoundPipeBuilder(*pr.costs, c.partition, pr.num_workers, pr.num_microbatches, round, mode, choice.sim);
      // Async iterations overlap: more of them before the marginal cost settles.
      const int k = SteadyStateIterations(c.partition, pr.num_workers, pr.num_microbatches, round,
                                          mode == OptimizerMode::kAsync ? 4 : 1);
      auto st = MeasureSteadyState(build, k, false, false);
      if (!st.ok()) continue;
      if (!best || st->period_s < best_period * (1 - 1e-9)) {
        best = c;
        best->microbatches_per_round = choice.choose_round_size ? round : 0;
        best_period = st->period_s;
      }
    }
  }
  if (!best) return AutoPartition(pr);
  return *best;
}

}  // namespace

absl::StatusOr<PartitionResult> SimulatedBestPartition(const PartitionProblem& pr, const SimulatedChoice& choice) {
  std::vector<PartitionResult> cands = CandidatePartitions(pr, choice.max_candidates, choice.per_stage_count);
  if (cands.empty()) return AutoPartition(pr);  // for its error message
  auto add = [&](const absl::StatusOr<PartitionResult>& r) {
    if (r.ok() && PartitionAllowed(pr, *r) && std::none_of(cands.begin(), cands.end(), [&](const PartitionResult& c) {
          return c.partition == r->partition;
        })) {
      cands.push_back(*r);
    }
  };
  auto wider = [&](const Partition& shape) {
    const int n = pr.costs->num_layers() - shape.fused;
    for (int extra : {1, 2, 3, 4, 6, 8}) {
      if (shape.num_forward_stages() + extra <= n)
        add(BalancedPartition(pr, shape, shape.num_forward_stages() + extra));
    }
  };
  if (choice.balanced_twins) {
    const size_t greedy = cands.size();
    for (size_t i = 0; i < greedy; ++i) {
      const Partition shape = cands[i].partition;
      add(BalancedPartition(pr, shape));
      if (static_cast<int>(i) < choice.wider_forward) wider(shape);
    }
  }
  if (choice.near_minimum_window > 0) {
    // Every candidate with t_max close to the least possible (the favourites of each stage count
    // above sit at large t_max and can miss these), balanced, and the best few widened.
    PartitionProblem near = pr;
    near.t_max_window =
        pr.t_max_window > 0 ? std::min(pr.t_max_window, choice.near_minimum_window) : choice.near_minimum_window;
    const std::vector<PartitionResult> close = CandidatePartitions(near);  // objective order
    for (size_t i = 0; i < close.size(); ++i) {
      add(close[i]);
      if (!choice.balanced_twins) continue;
      add(BalancedPartition(pr, close[i].partition));
      if (static_cast<int>(i) < choice.wider_forward) wider(close[i].partition);
    }
  }
  return SimulateCandidates(pr, choice, cands);
}

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
