// The partition as stages (DescribeStages), as text (Partition::ToString), and what a given
// partition achieves on a problem (EvaluatePartition): slot times, t_max, memory per stage.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/planning/partition.h"
#include "scheduler/planning/partition_packing.h"

namespace rp::planning {

using partition_internal::CheckProblem;
using partition_internal::FitsMem;

std::string Partition::ToString() const {
  return absl::StrCat("F[", absl::StrJoin(forward, ","), "] B1=", fused, " B[", absl::StrJoin(backward, ","), "]");
}

std::vector<StageShape> DescribeStages(const Partition& p, const CostModel& costs) {
  std::vector<StageShape> out;
  auto add = [&](spec::StageKind kind, int first, int n) {
    StageShape s{kind, first, n, 0, 0};
    for (int l = first; l < first + n; ++l) {
      const LayerCost& c = costs.layers[static_cast<size_t>(l)];
      switch (kind) {
        case spec::StageKind::kForward:
        case spec::StageKind::kEval:  // a forward without saved activations; the planner makes none
          s.time_s += c.fwd_s;
          s.memory_bytes += costs.ForwardMemory(l);
          break;
        case spec::StageKind::kFused:
          s.time_s += c.fused_s;
          s.memory_bytes += costs.BackwardMemory(l);
          break;
        case spec::StageKind::kBackward:
          s.time_s += c.bwd_s;
          s.memory_bytes += costs.BackwardMemory(l);
          break;
      }
    }
    out.push_back(s);
  };
  int first = 0;
  for (int n : p.forward) {
    add(spec::StageKind::kForward, first, n);
    first += n;
  }
  const int L = costs.num_layers();
  add(spec::StageKind::kFused, L - p.fused, p.fused);
  int top = L - p.fused;
  for (int n : p.backward) {
    add(spec::StageKind::kBackward, top - n, n);
    top -= n;
  }
  return out;
}

absl::StatusOr<PartitionResult> EvaluatePartition(const PartitionProblem& pr, const Partition& p) {
  if (absl::Status st = CheckProblem(pr); !st.ok()) return st;
  const int L = pr.costs->num_layers();
  if (p.fused < 1 || p.fused > L) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", p.ToString(), ": B_1 must hold 1..", L, " layers"));
  }
  int fsum = 0, bsum = 0;
  for (size_t i = 0; i < p.forward.size(); ++i) {
    if (p.forward[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition ", p.ToString(), ": forward stage F_", i + 1, " has ", p.forward[i], " layers"));
    }
    fsum += p.forward[i];
  }
  for (size_t i = 0; i < p.backward.size(); ++i) {
    if (p.backward[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition ", p.ToString(), ": backward stage B_", i + 2, " has ", p.backward[i], " layers"));
    }
    bsum += p.backward[i];
  }
  if (fsum + p.fused != L) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", p.ToString(), ": forward stages cover ", fsum,
                                                   " layers + B_1 ", p.fused, " = ", fsum + p.fused, ", the model has ",
                                                   L));
  }
  if (bsum + p.fused != L) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", p.ToString(), ": backward stages cover ", bsum,
                                                   " layers + B_1 ", p.fused, " = ", bsum + p.fused, ", the model has ",
                                                   L));
  }
  PartitionResult r;
  r.partition = p;
  double work = 0;
  const auto stages = DescribeStages(p, *pr.costs);
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageShape& s = stages[i];
    if (!FitsMem(s.memory_bytes, pr.stage_memory_cap)) {
      return absl::ResourceExhaustedError(absl::StrCat("partition ", p.ToString(), ": stage slot ", i, " (layers ",
                                                       s.first_layer, "..", s.first_layer + s.num_layers - 1,
                                                       ") needs ", s.memory_bytes, " bytes, over the cap of ",
                                                       pr.stage_memory_cap));
    }
    r.t_max = std::max(r.t_max, s.time_s);
    work += s.time_s;
  }
  const double M = pr.num_microbatches, N = pr.num_workers;
  // With fewer stage slots than workers some workers get no slot at all: count S as at least N
  // (the reference implementation's min_stages), or the formula would reward S < N; and at least
  // the problem's own min_stages.
  const double S = std::max<double>({static_cast<double>(p.num_stages()), N, static_cast<double>(pr.min_stages)});
  const double span = (M * S + N * (N - 1)) * r.t_max;
  r.objective = span;
  r.predicted_bubble = span > 0 ? 1 - M * work / span : 0;
  return r;
}

}  // namespace rp::planning
