// partition_packing.h — (planning, internal to the partitioner) the primitives the partition
// searches share: the per-layer arrays of a cost model, greedy packing of contiguous layer groups
// under a time limit and a memory cap, splitting groups to a target count, the candidate t_max
// values, the largest fused stage, and the problem check. Only partition*.cc include it.
//
// Contract: pure functions, any thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "scheduler/planning/partition.h"

namespace rp::planning::partition_internal {

inline constexpr double kRelEps = 1e-9;

inline bool Fits(double sum, double limit) { return sum <= limit * (1 + kRelEps); }
inline bool FitsMem(int64_t sum, int64_t cap) { return cap <= 0 || sum <= cap; }

struct LayerArrays {
  std::vector<double> f, b, u;  // forward, backward(+recompute), fused times
  std::vector<int64_t> fm, bm;  // forward / backward memory
};

inline LayerArrays Arrays(const CostModel& c) {
  LayerArrays a;
  for (int l = 0; l < c.num_layers(); ++l) {
    const LayerCost& x = c.layers[static_cast<size_t>(l)];
    a.f.push_back(x.fwd_s);
    a.b.push_back(x.bwd_s);
    a.u.push_back(x.fused_s);
    a.fm.push_back(c.ForwardMemory(l));
    a.bm.push_back(c.BackwardMemory(l));
  }
  return a;
}

// Minimal number of contiguous groups of items [0, n) with sum(v) <= limit and sum(mem) <= cap.
// Greedy is optimal because both constraints are additive over non-negative items. Packs from
// item n-1 downwards when `from_end`. Returns group sizes in item order, or nullopt when a
// single item violates a constraint.
// The packing itself: calls group(size, time) for every group in packing order; false when a
// single item violates a constraint.
template <typename OnGroup>
bool Pack(const std::vector<double>& v, const std::vector<int64_t>& mem, int n, double limit, int64_t cap,
          bool from_end, OnGroup&& group) {
  double sum = 0;
  int64_t msum = 0;
  int count = 0;
  for (int k = 0; k < n; ++k) {
    const int i = from_end ? n - 1 - k : k;
    const double x = v[static_cast<size_t>(i)];
    const int64_t m = mem[static_cast<size_t>(i)];
    if (count > 0 && Fits(sum + x, limit) && FitsMem(msum + m, cap)) {
      sum += x;
      msum += m;
      ++count;
      continue;
    }
    if (!Fits(x, limit) || !FitsMem(m, cap)) return false;
    if (count > 0) group(count, sum);
    sum = x;
    msum = m;
    count = 1;
  }
  if (count > 0) group(count, sum);
  return true;
}

inline std::optional<std::vector<int>> GreedyPack(const std::vector<double>& v, const std::vector<int64_t>& mem, int n,
                                                  double limit, int64_t cap, bool from_end) {
  std::vector<int> counts;
  if (!Pack(v, mem, n, limit, cap, from_end, [&](int c, double) { counts.push_back(c); })) return std::nullopt;
  if (from_end) std::reverse(counts.begin(), counts.end());
  return counts;
}

inline double GroupTime(const std::vector<double>& v, int first, int count) {
  double s = 0;
  for (int i = first; i < first + count; ++i) s += v[static_cast<size_t>(i)];
  return s;
}

// Splits groups (sizes in item order over `v`) until there are `target` groups: always the
// slowest splittable group, at the cut that minimizes the larger half. Never raises the max.
inline void SplitTo(std::vector<int>& groups, const std::vector<double>& v, int target) {
  while (static_cast<int>(groups.size()) < target) {
    int best = -1;
    double best_t = -1;
    int first = 0, best_first = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const double t = GroupTime(v, first, groups[g]);
      if (groups[g] > 1 && t > best_t) {
        best_t = t;
        best = static_cast<int>(g);
        best_first = first;
      }
      first += groups[g];
    }
    if (best < 0) return;  // nothing splittable (caller guarantees target <= items)
    const int n = groups[static_cast<size_t>(best)];
    int cut = 1;
    double cut_cost = std::numeric_limits<double>::infinity();
    for (int c = 1; c < n; ++c) {
      const double cost = std::max(GroupTime(v, best_first, c), GroupTime(v, best_first + c, n - c));
      if (cost < cut_cost) {
        cut_cost = cost;
        cut = c;
      }
    }
    groups[static_cast<size_t>(best)] = cut;
    groups.insert(groups.begin() + best + 1, n - cut);
  }
}

// Every contiguous sum of forward or backward times (of layers below the head) and every fused
// suffix sum: the t_max values a greedy partition can have, ascending, restricted to [lo, hi]
// (sums grow along a run of non-negative times, so a run stops at hi).
inline std::vector<double> Candidates(const LayerArrays& a, int L, double lo = 0,
                                      double hi = std::numeric_limits<double>::infinity()) {
  std::vector<double> cand;
  auto keep = [&](double s) {
    if (s >= lo * (1 - kRelEps)) cand.push_back(s);
  };
  for (const auto* v : {&a.f, &a.b}) {
    for (int i = 0; i + 1 < L; ++i) {
      double s = 0;
      for (int j = i; j + 1 < L; ++j) {
        s += (*v)[static_cast<size_t>(j)];
        if (s > hi * (1 + kRelEps)) break;
        keep(s);
      }
    }
  }
  double s = 0;
  for (int j = L - 1; j >= 0; --j) {
    s += a.u[static_cast<size_t>(j)];
    if (s > hi * (1 + kRelEps)) break;
    keep(s);
  }
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
  return cand;
}

// Largest B_1 whose fused time fits `limit` and whose memory fits the cap (0 if none).
inline int MaxFused(const LayerArrays& a, int L, double limit, int64_t cap) {
  double s = 0;
  int64_t m = 0;
  int k = 0;
  for (int j = L - 1; j >= 0; --j) {
    if (!Fits(s + a.u[static_cast<size_t>(j)], limit) || !FitsMem(m + a.bm[static_cast<size_t>(j)], cap)) break;
    s += a.u[static_cast<size_t>(j)];
    m += a.bm[static_cast<size_t>(j)];
    ++k;
  }
  return k;
}

// Forward groups (layer order) and backward groups (layer order) -> Partition.
inline Partition MakePartition(const std::vector<int>& fwd, int fused, const std::vector<int>& bwd_layer_order) {
  Partition p;
  p.forward = fwd;
  p.fused = fused;
  p.backward.assign(bwd_layer_order.rbegin(), bwd_layer_order.rend());
  return p;
}

inline absl::Status CheckProblem(const PartitionProblem& pr) {
  if (pr.costs == nullptr || pr.costs->num_layers() == 0) {
    return absl::InvalidArgumentError("partition: the cost model has no layers");
  }
  if (pr.num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("partition: need at least one worker, got ", pr.num_workers));
  }
  if (pr.num_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: need at least one micro-batch, got ", pr.num_microbatches));
  }
  const int L = pr.costs->num_layers();
  if (pr.min_stages < 0 || pr.min_stages > 2 * L - 1) {
    return absl::InvalidArgumentError(absl::StrCat("partition: min_stages ", pr.min_stages, " is outside 0..",
                                                   2 * L - 1, " (", L, " layers make at most ", 2 * L - 1,
                                                   " stage slots)"));
  }
  if (pr.t_max_window != 0 && !(pr.t_max_window >= 1 && std::isfinite(pr.t_max_window))) {
    return absl::InvalidArgumentError(absl::StrCat("partition: t_max_window ", pr.t_max_window,
                                                   " must be >= 1 (t_max in [W, window*W]) or 0 (no window)"));
  }
  for (int l = 0; l < L; ++l) {
    const LayerCost& c = pr.costs->layers[static_cast<size_t>(l)];
    if (!(c.fwd_s >= 0) || !(c.bwd_s >= 0) || !(c.fused_s >= 0) || !std::isfinite(c.fwd_s + c.bwd_s + c.fused_s)) {
      return absl::InvalidArgumentError(absl::StrCat("partition: layer ", l, " has a negative or non-finite time"));
    }
    const int64_t need = std::max(pr.costs->ForwardMemory(l), pr.costs->BackwardMemory(l));
    if (!FitsMem(need, pr.stage_memory_cap)) {
      return absl::ResourceExhaustedError(absl::StrCat("partition: layer ", l, " alone needs ", need,
                                                       " bytes of device memory, over the per-stage cap of ",
                                                       pr.stage_memory_cap, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace rp::planning::partition_internal
