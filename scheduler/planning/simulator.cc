#include "scheduler/planning/simulator.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rp::planning {

absl::StatusOr<SimResult> Simulate(const SimSchedule& s) {
  const size_t T = s.tasks.size();
  const int R = std::max(s.num_resources, static_cast<int>(s.order.size()));
  if (s.num_workers < 1) return absl::InvalidArgumentError("simulate: schedule has no workers");
  size_t ordered = 0;
  for (const auto& o : s.order) ordered += o.size();
  if (ordered != T) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulate: ", T, " tasks but ", ordered, " entries in the resource orders"));
  }
  for (size_t t = 0; t < T; ++t) {
    for (const TaskDep& d : s.tasks[t].deps) {
      if (d.task < 0 || static_cast<size_t>(d.task) >= T || static_cast<size_t>(d.task) == t) {
        return absl::InvalidArgumentError(absl::StrCat("simulate: task ", t, " has a bad dependency ", d.task));
      }
    }
  }
  constexpr double kUnset = -1;
  SimResult r;
  r.start.assign(T, kUnset);
  r.finish.assign(T, kUnset);
  r.busy.assign(static_cast<size_t>(R), 0);
  std::vector<size_t> next(static_cast<size_t>(R), 0);
  std::vector<double> free_at(static_cast<size_t>(R), 0);
  size_t done = 0;
  // Sweep the resources; each sweep starts every task whose dependencies are resolved. With a
  // fixed order per resource the computed times do not depend on the sweep order.
  while (done < T) {
    bool progress = false;
    for (int res = 0; res < R; ++res) {
      const auto& ord = s.order[static_cast<size_t>(res)];
      size_t& i = next[static_cast<size_t>(res)];
      while (i < ord.size()) {
        const int t = ord[i];
        const SimTask& task = s.tasks[static_cast<size_t>(t)];
        double ready = free_at[static_cast<size_t>(res)];
        double tail_ready = 0;
        bool ok = true;
        for (const TaskDep& d : task.deps) {
          const double at = d.on_start ? r.start[static_cast<size_t>(d.task)] : r.finish[static_cast<size_t>(d.task)];
          if (at == kUnset) {
            ok = false;
            break;
          }
          double& gate = d.tail_only ? tail_ready : ready;
          gate = std::max(gate, at + d.latency_s);
        }
        if (!ok) break;
        const double head = task.duration_s * std::clamp(task.head_fraction, 0.0, 1.0);
        const double finish = std::max(ready + head, tail_ready) + (task.duration_s - head);
        r.start[static_cast<size_t>(t)] = ready;
        r.finish[static_cast<size_t>(t)] = finish;
        free_at[static_cast<size_t>(res)] = finish;
        r.busy[static_cast<size_t>(res)] += task.duration_s;
        ++i;
        ++done;
        progress = true;
      }
    }
    if (!progress) {
      return absl::FailedPreconditionError(
          absl::StrCat("simulate: schedule '", s.name, "' deadlocks with ", T - done, " of ", T, " tasks unstarted"));
    }
  }
  r.iteration_end.assign(static_cast<size_t>(std::max(1, s.iterations)), 0);
  for (size_t t = 0; t < T; ++t) {
    const SimTask& task = s.tasks[t];
    r.makespan = std::max(r.makespan, r.finish[t]);
    if (task.resource < s.num_workers) {
      r.gpu_work += task.duration_s;
      const size_t it = static_cast<size_t>(std::clamp(task.iteration, 0, std::max(1, s.iterations) - 1));
      r.iteration_end[it] = std::max(r.iteration_end[it], r.finish[t]);
    }
  }
  const double N = s.num_workers;
  r.bubble_ratio = r.makespan > 0 ? 1 - r.gpu_work / (N * r.makespan) : 0;
  return r;
}

SimSchedule Balanced(SimSchedule s) {
  double sum[2] = {0, 0};
  int cnt[2] = {0, 0};
  const bool together = s.balance_all_phases_together;
  auto cls = [together](TaskPhase p) { return together || p == TaskPhase::kForward ? 0 : 1; };
  for (const SimTask& t : s.tasks) {
    if (t.resource >= s.num_workers) continue;
    sum[cls(t.phase)] += t.duration_s;
    ++cnt[cls(t.phase)];
  }
  for (SimTask& t : s.tasks) {
    if (t.resource >= s.num_workers) continue;
    const int c = cls(t.phase);
    t.duration_s = sum[c] / cnt[c];
  }
  return s;
}

absl::StatusOr<SteadyState> MeasureSteadyState(const ScheduleBuilder& build, int k, bool with_optimizer,
                                               bool balanced) {
  if (k < 1) return absl::InvalidArgumentError("steady state: need at least one iteration");
  absl::StatusOr<SimResult> r[2];
  int workers = 0;
  for (int i = 0; i < 2; ++i) {
    auto s = build(k * (i + 1), with_optimizer);
    if (!s.ok()) return s.status();
    workers = s->num_workers;
    r[i] = Simulate(balanced ? Balanced(*std::move(s)) : *std::move(s));
    if (!r[i].ok()) return r[i].status();
  }
  SteadyState out;
  out.period_s = (r[1]->makespan - r[0]->makespan) / k;
  out.work_per_iteration_s = r[0]->gpu_work / k;
  out.bubble_ratio = out.period_s > 0 ? 1 - out.work_per_iteration_s / (workers * out.period_s) : 0;
  return out;
}

absl::StatusOr<BubbleBreakdown> AnalyzeBubbles(const ScheduleBuilder& build, int k) {
  auto actual = MeasureSteadyState(build, k, true, false);
  if (!actual.ok()) return actual.status();
  auto bal_opt = MeasureSteadyState(build, k, true, true);
  if (!bal_opt.ok()) return bal_opt.status();
  auto bal_noopt = MeasureSteadyState(build, k, false, true);
  if (!bal_noopt.ok()) return bal_noopt.status();
  BubbleBreakdown b;
  b.period_s = actual->period_s;
  if (actual->period_s <= 0) return b;
  // Idle GPU-seconds per iteration (bubble x N x period) as a share of N x the actual period.
  auto share = [&](const SteadyState& s) { return s.bubble_ratio * s.period_s / actual->period_s; };
  b.total = actual->bubble_ratio;
  b.fill_drain = share(*bal_noopt);
  b.optimizer = share(*bal_opt) - b.fill_drain;
  b.imbalance = b.total - b.fill_drain - b.optimizer;
  return b;
}

}  // namespace rp::planning
