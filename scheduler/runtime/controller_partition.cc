// Controller: the partition in use (the activation consumers and transfer counts it implies) and
// the automatic partition planned from the profiling iterations' measured times.
#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "scheduler/planning/comparison.h"
#include "scheduler/planning/partition.h"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/profile_costs.h"

namespace rp::scheduler {

using spec::StageKind;

void Controller::ApplyPartition(const planning::Partition& p) {
  opt_.partition = p;
  const int L = store_->config().num_layers();
  act_consumers_.assign(static_cast<size_t>(L + 1), 0);
  int first = 0;
  for (int n : p.forward) {
    ++act_consumers_[static_cast<size_t>(first)];
    first += n;
  }
  ++act_consumers_[static_cast<size_t>(L - p.fused)];
  int top = L - p.fused;
  for (int n : p.backward) {
    top -= n;
    ++act_consumers_[static_cast<size_t>(top)];
  }
  if (book_) {
    // Per-layer upload / gradient-download counts of one iteration.
    const int M = opt_.microbatches;
    const int R = M / (opt_.microbatches_per_round > 0 ? opt_.microbatches_per_round : M);
    std::vector<int> uploads(static_cast<size_t>(L), 0), grads(static_cast<size_t>(L), 0);
    for (const auto& st :
         planning::DescribeStages(p, planning::CostModel{std::vector<planning::LayerCost>(static_cast<size_t>(L))})) {
      for (int l = st.first_layer; l < st.first_layer + st.num_layers; ++l) {
        uploads[static_cast<size_t>(l)] += R;
        if (st.kind != spec::StageKind::kForward) grads[static_cast<size_t>(l)] += R;
      }
    }
    book_->SetCounts(uploads, grads, iteration_);
  }
}

// Feeds the compute times of a profiling iteration (one layer per slot) into the profile and,
// once enough iterations were measured, plans the partition used from the next iteration on.
void Controller::RecordProfile(int iteration, const InFlight& f) {
  if (!profile_ || !timeline_ || planned_) return;
  // Compute time per (slot, micro-batch): a backward stage that recomputes ahead runs as two
  // operations (recompute, then backward), which together are its recompute+backward time.
  std::map<std::pair<int, int>, double> compute_s;
  for (const workers::TimelineEntry& e : timeline_->EntriesEndingSince(f.timeline_start)) {
    if (e.job != opt_.timeline_job || e.iteration != iteration || e.slot < 0 ||
        e.slot >= static_cast<int>(f.slots.size())) {
      continue;
    }
    if (e.stream == "act-down" && f.slots[static_cast<size_t>(e.slot)].kind == spec::StageKind::kForward &&
        absl::StartsWith(e.label, "out ")) {
      hop_samples_.push_back(e.end_s - e.start_s);
    }
    if (e.stream == "compute") compute_s[{e.slot, e.microbatch}] += e.end_s - e.start_s;
  }
  for (const auto& [key, seconds] : compute_s) {
    const planning::StageSlot& sl = f.slots[static_cast<size_t>(key.first)];
    if (sl.num_layers != 1) continue;
    const auto kind = sl.kind == spec::StageKind::kForward ? planning::MeasuredProfile::Kind::kForward
                      : sl.kind == spec::StageKind::kFused ? planning::MeasuredProfile::Kind::kFused
                                                           : planning::MeasuredProfile::Kind::kBackward;
    profile_->Record(sl.first_layer, kind, seconds);
  }
  if (++profiled_iterations_ < opt_.profile_iterations || !profile_->Complete()) return;
  // Memory from the real parameter sizes and the analytic activation estimate, times measured.
  const planning::CostModel base =
      runtime::ProfileBaseCosts(*store_, last_microbatch_rows_, last_seq_len_, opt_.head_chunk_tokens);
  planning::CostModel measured = profile_->Apply(base);
  measured_ = measured;
  if (!hop_samples_.empty()) {
    std::vector<double> hops = hop_samples_;
    std::nth_element(hops.begin(), hops.begin() + static_cast<std::ptrdiff_t>(hops.size() / 2), hops.end());
    measured_hop_s_ = 2 * hops[hops.size() / 2];
  }
  const int usable = static_cast<int>(recovery_->Usable().size());
  std::string why;
  if (PlanPartition(measured, usable > 0 ? usable : num_workers(), opt_.partition_by_simulation, &why)) {
    plan_problem_.clear();
  } else {
    // Keep the profiling partition (one layer per slot: the smallest stages there are) and say
    // why; planning is retried after every further iteration.
    plan_problem_ = absl::StrCat("automatic partition failed (", why, "); running one layer per stage slot");
  }
}

}  // namespace rp::scheduler
