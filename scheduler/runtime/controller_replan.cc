// Controller: re-planning between iterations — the workers usable now (one lost, drained or back)
// and a tighter per-stage memory cap after a stage slot ran out of device memory.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/comparison.h"
#include "scheduler/planning/partition.h"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/profile_costs.h"

namespace rp::scheduler {

namespace {

// What to re-plan with before any time was measured: the job's real memory, and every layer's
// time alike, so the partition balances layer counts under the memory cap.
planning::CostModel UniformTimes(planning::CostModel c) {
  for (planning::LayerCost& l : c.layers) {
    l.fwd_s = 1;
    l.bwd_s = 3;  // the recompute and the backward
    l.fused_s = 3;
  }
  return c;
}

// The device memory the cost model predicts for the stage slot `t`.
int64_t StageBytes(const planning::CostModel& c, const workers::StageTask& t) {
  const bool forward = t.kind == spec::StageKind::kForward || t.kind == spec::StageKind::kEval;
  int64_t bytes = 0;
  for (int l = t.first_layer; l < t.first_layer + t.num_layers; ++l) {
    bytes += forward ? c.ForwardMemory(l) : c.BackwardMemory(l);
  }
  return bytes;
}

// A planning copy in which a layer that alone needs more than `cap` counts as needing exactly
// `cap` (forward and backward alike): it runs in a stage of its own — nothing smaller exists —
// and the cap still binds every stage of two layers or more. Returns how many layers it clamped.
// Only memory changes (the fixed working set, then the gradient bytes), so such a copy is planned
// by the paper's objective, not simulated (the gradient bytes time the simulated downloads).
int ClampOversizedLayers(planning::CostModel& c, int64_t cap) {
  int clamped = 0;
  for (int l = 0; l < c.num_layers(); ++l) {
    planning::LayerCost& x = c.layers[static_cast<size_t>(l)];
    const int64_t fwd = c.ForwardMemory(l), bwd = c.BackwardMemory(l);
    if (std::max(fwd, bwd) <= cap) continue;
    ++clamped;
    x.fixed_work_bytes -= std::max<int64_t>(0, fwd - cap);  // the forward now needs at most the cap
    x.trainable_bytes -= std::max<int64_t>(0, c.BackwardMemory(l) - cap);
  }
  return clamped;
}

std::string GiB(int64_t bytes) {
  return absl::StrCat(static_cast<double>(bytes * 100 / (int64_t{1} << 30)) / 100, " GiB (", bytes, " bytes)");
}

}  // namespace

void Controller::NoteWorkerChanges(const std::vector<int>& usable) {
  const int n = static_cast<int>(usable.size());
  for (int w : last_usable_) {
    if (std::find(usable.begin(), usable.end(), w) != usable.end()) continue;
    const workers::DeviceHealth& h = workers_[static_cast<size_t>(w)]->device()->health();
    PlanChange c;
    c.cause = h.lost() ? PlanChange::Cause::kWorkerLost : PlanChange::Cause::kWorkerDrained;
    c.worker = h.device_index();
    c.workers = n;
    c.detail = h.lost() ? std::string(h.why().message()) : "drained by an operator";
    pending_changes_.push_back(c);
  }
  for (int w : usable) {
    if (std::find(last_usable_.begin(), last_usable_.end(), w) != last_usable_.end()) continue;
    PlanChange c;
    c.cause = PlanChange::Cause::kWorkerReturned;
    c.worker = workers_[static_cast<size_t>(w)]->device()->health().device_index();
    c.workers = n;
    c.detail = "back in the pool";
    pending_changes_.push_back(c);
  }
  last_usable_ = usable;
}

void Controller::Replan() {
  const std::vector<int> usable = recovery_->Usable();
  const size_t noted = pending_changes_.size();
  NoteWorkerChanges(usable);
  const std::vector<runtime::OutOfMemoryRun> ooms = recovery_->TakeOutOfMemory();
  const int n = static_cast<int>(usable.size());
  // A measured partition is re-planned for the workers left (or back); a partition given by
  // the job, or the profiling one, keeps its shape on fewer workers (the dispatch plan adapts).
  const bool resize = measured_.has_value() && n > 0 && n != plan_workers_;
  if ((ooms.empty() && !resize) || n == 0) return;
  const planning::CostModel costs = measured_
                                        ? *measured_
                                        : UniformTimes(runtime::ProfileBaseCosts(
                                              *store_, last_microbatch_rows_, last_seq_len_, opt_.head_chunk_tokens));
  for (const runtime::OutOfMemoryRun& o : ooms) {
    // The stage that did not fit had at most its predicted bytes: plan every stage well below.
    const int64_t tighter = std::max<int64_t>(1, StageBytes(costs, o.task) * 3 / 4);
    opt_.stage_memory_cap = opt_.stage_memory_cap > 0 ? std::min(opt_.stage_memory_cap, tighter) : tighter;
    cap_from_memory_fault_ = true;
    PlanChange c;
    c.cause = PlanChange::Cause::kOutOfMemory;
    c.workers = n;
    c.stage_memory_cap = opt_.stage_memory_cap;
    c.detail = absl::StrCat(o.what, "; the slot was repeated; stage memory cap now ", GiB(opt_.stage_memory_cap));
    pending_changes_.push_back(c);
  }
  // The change the re-planned partition is reported with: the last one noted now.
  PlanChange* last = pending_changes_.size() > noted ? &pending_changes_.back() : nullptr;
  if (profile_ && !measured_) {
    // Still profiling one layer per slot (the smallest stages there are): the automatic
    // partition will be planned under the tighter cap once the profile is complete.
    if (last != nullptr && !ooms.empty()) last->detail += "; the profiling partition (one layer per slot) is kept";
    return;
  }
  std::string why;
  if (PlanPartition(costs, n, measured_.has_value() && opt_.partition_by_simulation && !cap_from_memory_fault_, &why)) {
    if (last != nullptr) {
      last->partition = planned_->partition.ToString();
      absl::StrAppend(&last->detail, "; re-planned for ", n, " workers: ", last->partition);
    }
    return;
  }
  plan_workers_ = n;  // not retried every iteration: the next change re-plans again
  plan_problem_ = absl::StrCat("re-planning failed (", why, "); keeping ", opt_.partition.ToString());
  if (last != nullptr) absl::StrAppend(&last->detail, "; ", plan_problem_);
}

bool Controller::PlanPartition(const planning::CostModel& measured, int num_workers, bool simulate, std::string* why) {
  planning::CostModel costs = measured;
  // A cap a device fault set may be below a single layer's need: such a layer runs alone.
  if (cap_from_memory_fault_ && ClampOversizedLayers(costs, opt_.stage_memory_cap) > 0) simulate = false;
  planning::PartitionProblem problem{&costs, num_workers, opt_.microbatches, opt_.stage_memory_cap};
  problem.min_stages = opt_.min_stages;
  problem.t_max_window = opt_.t_max_window;
  planning::SimulatedChoice choice;
  choice.microbatches_per_round = opt_.microbatches_per_round;
  choice.choose_round_size = opt_.choose_round_size;
  choice.mode = opt_.mode;
  choice.sim.recompute_ahead = opt_.recompute_ahead;
  auto r = simulate ? planning::SimulatedBestPartition(problem, choice) : planning::AutoPartition(problem);
  if (!r.ok()) {
    *why = std::string(r.status().message());
    return false;
  }
  planned_ = *r;
  if (planned_->microbatches_per_round == 0) planned_->microbatches_per_round = opt_.microbatches_per_round;
  plan_workers_ = num_workers;
  return true;
}

}  // namespace rp::scheduler
