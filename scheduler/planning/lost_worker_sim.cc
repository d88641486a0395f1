#include "scheduler/planning/lost_worker_sim.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rp::planning {
namespace {

bool IsCompute(TaskPhase p) { return p == TaskPhase::kForward || p == TaskPhase::kFused || p == TaskPhase::kBackward; }

absl::StatusOr<int> FaultSlot(const DispatchPlan& plan, const LostWorkerFault& f) {
  for (const StageSlot& sl : plan.slots) {
    if (sl.iteration == f.iteration && sl.slot_in_round == f.slot_in_round && f.microbatch >= sl.first_microbatch &&
        f.microbatch < sl.first_microbatch + sl.num_microbatches) {
      return sl.index;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("lost worker: iteration ", f.iteration, " has no slot ",
                                                 f.slot_in_round, " with micro-batch ", f.microbatch));
}

// The last iteration dispatched by time `t` in a run without the loss: sync, iteration k once
// k-1 stepped; async, once k-2 finished and stepped.
int LastDispatchedBy(const SimSchedule& s, const SimResult& r, bool async, int K, double t) {
  std::vector<double> done(static_cast<size_t>(K), 0);  // slots and step of each iteration
  for (size_t i = 0; i < s.tasks.size(); ++i) {
    const SimTask& task = s.tasks[i];
    if (IsCompute(task.phase) || task.phase == TaskPhase::kOptimizer) {
      double& d = done[static_cast<size_t>(task.iteration)];
      d = std::max(d, r.finish[i]);
    }
  }
  const int lag = async ? 2 : 1;
  int last = 0;
  for (int k = 1; k < K; ++k) {
    const double at = k < lag ? 0 : done[static_cast<size_t>(k - lag)];
    if (at <= t) last = k;
  }
  return last;
}

// The plan with iterations after `last` over the survivors (worker ids of the full pool), the
// round robin continued.
absl::StatusOr<DispatchPlan> PlanAroundTheLoss(const Partition& p, int L, const DispatchOptions& d, int last,
                                               int lost) {
  DispatchOptions before = d;
  before.iterations = last + 1;
  auto plan = BuildDispatchPlan(p, L, before);
  if (!plan.ok() || last + 1 >= d.iterations) return plan;
  std::vector<int> survivors;
  for (int w = 0; w < d.num_workers; ++w) {
    if (w != lost) survivors.push_back(w);
  }
  if (survivors.empty()) return absl::FailedPreconditionError("lost worker: no worker survives");
  DispatchOptions after = d;
  after.num_workers = static_cast<int>(survivors.size());
  after.iterations = d.iterations - last - 1;
  after.g0 = plan->next_g0 % after.num_workers;
  auto rest = BuildDispatchPlan(p, L, after);
  if (!rest.ok()) return rest.status();
  const int offset = static_cast<int>(plan->slots.size());
  for (StageSlot sl : rest->slots) {
    sl.index += offset;
    sl.iteration += last + 1;
    sl.worker = survivors[static_cast<size_t>(sl.worker)];
    for (SlotDependency& dep : sl.deps) dep.slot += offset;
    plan->slots.push_back(std::move(sl));
  }
  plan->options.iterations = d.iterations;
  return plan;
}

// Moves the lost worker's unfinished slots onto fresh lanes of the survivors (see the header).
class Rerun {
 public:
  Rerun(SimSchedule& s, const DispatchPlan& plan, int lost, double at)
      : s_(s), plan_(plan), lost_(lost), N_(s.num_workers) {
    SimTask marker;  // the loss: nothing re-runs before it
    marker.resource = s.num_resources;
    marker.duration_s = at;
    marker.phase = TaskPhase::kOptimizer;  // not compute
    marker.microbatch = -1;
    s_.resource_names.push_back("loss");
    marker_ = AddOn(marker.resource, std::move(marker));
    for (int w = 0; w < N_; ++w) {
      if (w != lost) survivors_.push_back(w);
    }
  }

  // Slot `fault` faulted as its micro-batch `m` (index within it) started; every later slot of
  // the same worker up to `last_slot` was queued behind it.
  int Apply(int fault, int m, int last_slot) {
    int moved = 0;
    for (int i = fault; i <= last_slot; ++i) {
      if (plan_.slots[static_cast<size_t>(i)].worker != lost_) continue;
      // One fresh lane per survivor, made as the first slot goes there; the slots in turn.
      const size_t k = static_cast<size_t>(moved++) % survivors_.size();
      if (k >= lanes_.size()) lanes_.push_back(NewLane(survivors_[k]));
      MoveSlot(i, i == fault ? m : 0, lanes_[k]);
    }
    s_.num_resources = static_cast<int>(s_.order.size());
    return moved;
  }

 private:
  int AddOn(int resource, SimTask t) {
    t.resource = resource;
    if (resource >= static_cast<int>(s_.order.size())) s_.order.resize(static_cast<size_t>(resource) + 1);
    return s_.Add(std::move(t));
  }

  // A fresh lane on `survivor`: compute, upload link, download link (resources of their own).
  int NewLane(int survivor) {
    const int first = static_cast<int>(s_.order.size());
    for (const char* what : {"", "-param-up", "-grad-down"}) {
      s_.resource_names.push_back(absl::StrCat("gpu", survivor, "-rerun", first, what));
    }
    s_.order.resize(static_cast<size_t>(first) + 3);
    return first;
  }

  void Take(int task, int resource) {
    auto& from = s_.order[static_cast<size_t>(s_.tasks[static_cast<size_t>(task)].resource)];
    from.erase(std::find(from.begin(), from.end(), task));
    s_.tasks[static_cast<size_t>(task)].resource = resource;
    s_.order[static_cast<size_t>(resource)].push_back(task);
  }

  // The slot runs again, whole, on `lane`: its upload again, the `ran` micro-batches that ran on
  // the lost worker once more (their copies feed nothing: their outputs were kept), the rest
  // moved there, its gradient download after them.
  void MoveSlot(int i, int ran, int lane) {
    const SlotTasks st = s_.slots[static_cast<size_t>(i)];
    int gate = marker_;
    if (st.upload >= 0) {
      SimTask up = s_.tasks[static_cast<size_t>(st.upload)];
      if (ran > 0) {
        up.deps.push_back({marker_});
        gate = AddOn(lane + 1, std::move(up));
      } else {
        s_.tasks[static_cast<size_t>(st.upload)].deps.push_back({marker_});
        Take(st.upload, lane + 1);
        gate = st.upload;
      }
    }
    for (int k = 0; k < st.count; ++k) {
      const int t = st.first + k;
      if (k < ran) {
        SimTask copy = s_.tasks[static_cast<size_t>(t)];
        copy.deps.push_back({gate});
        AddOn(lane, std::move(copy));
      } else {
        s_.tasks[static_cast<size_t>(t)].deps.push_back({gate});
        Take(t, lane);
      }
    }
    if (st.grad_download >= 0) Take(st.grad_download, lane + 2);
  }

  SimSchedule& s_;
  const DispatchPlan& plan_;
  const int lost_, N_;
  int marker_ = -1;
  std::vector<int> survivors_;
  std::vector<int> lanes_;  // per survivor (in order): its fresh lane's first resource
};

}  // namespace

absl::StatusOr<LostWorkerRun> SimulateLostWorker(const Partition& partition, const CostModel& costs,
                                                 const DispatchOptions& dispatch, const SimOptions& options,
                                                 const LostWorkerFault& fault) {
  const bool async = dispatch.mode == OptimizerMode::kAsync;
  auto clean_plan = BuildDispatchPlan(partition, costs.num_layers(), dispatch);
  if (!clean_plan.ok()) return clean_plan.status();
  auto slot = FaultSlot(*clean_plan, fault);
  if (!slot.ok()) return slot.status();
  auto clean = RoundPipeSchedule(*clean_plan, costs, options);
  if (!clean.ok()) return clean.status();
  auto clean_run = Simulate(*clean);
  if (!clean_run.ok()) return clean_run.status();
  const StageSlot& fs = clean_plan->slots[static_cast<size_t>(*slot)];
  const int m = fault.microbatch - fs.first_microbatch;
  LostWorkerRun out;
  out.lost_worker = fs.worker;
  out.lost_at_s = clean_run->start[static_cast<size_t>(clean->slots[static_cast<size_t>(*slot)].first + m)];
  out.last_iteration_before = LastDispatchedBy(*clean, *clean_run, async, dispatch.iterations, out.lost_at_s);
  auto plan = PlanAroundTheLoss(partition, costs.num_layers(), dispatch, out.last_iteration_before, fs.worker);
  if (!plan.ok()) return plan.status();
  auto schedule = RoundPipeSchedule(*plan, costs, options);
  if (!schedule.ok()) return schedule.status();
  int last_slot = -1;  // the last slot dispatched before the loss
  for (const StageSlot& sl : plan->slots) {
    if (sl.iteration <= out.last_iteration_before) last_slot = sl.index;
  }
  out.slots_rerun = Rerun(*schedule, *plan, fs.worker, out.lost_at_s).Apply(*slot, m, last_slot);
  auto result = Simulate(*schedule);
  if (!result.ok()) return result.status();
  out.iteration_end.assign(static_cast<size_t>(dispatch.iterations), 0);
  for (size_t t = 0; t < schedule->tasks.size(); ++t) {
    const SimTask& task = schedule->tasks[t];
    if (!IsCompute(task.phase)) continue;
    double& e = out.iteration_end[static_cast<size_t>(task.iteration)];
    e = std::max(e, result->finish[t]);
  }
  out.schedule = *std::move(schedule);
  out.result = *std::move(result);
  return out;
}

}  // namespace rp::planning
