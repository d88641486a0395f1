#include "scheduler/planning/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/planning/partition_packing.h"

namespace rp::planning {
using partition_internal::Arrays;
using partition_internal::Candidates;
using partition_internal::CheckProblem;
using partition_internal::GreedyPack;
using partition_internal::GroupTime;
using partition_internal::kRelEps;
using partition_internal::LayerArrays;
using partition_internal::MakePartition;
using partition_internal::MaxFused;
using partition_internal::Pack;
using partition_internal::SplitTo;

namespace {

// The greedy partition for a candidate t_max (largest B_1, then minimal forward and backward
// stage counts), or nullopt when some layer does not fit.
std::optional<Partition> GreedyAt(const LayerArrays& a, int L, double T, int64_t cap) {
  const int fused = MaxFused(a, L, T, cap);
  if (fused == 0) return std::nullopt;
  const int n = L - fused;
  auto fwd = GreedyPack(a.f, a.fm, n, T, cap, /*from_end=*/true);
  if (!fwd) return std::nullopt;
  auto bwd = GreedyPack(a.b, a.bm, n, T, cap, /*from_end=*/false);
  if (!bwd) return std::nullopt;
  return MakePartition(*fwd, fused, *bwd);
}

// What AutoPartition compares of a greedy partition, without building it: the same packing as
// GreedyPack, counting groups and the slowest one.
bool PackCount(const std::vector<double>& v, const std::vector<int64_t>& mem, int n, double limit, int64_t cap,
               bool from_end, int* groups, double* slowest) {
  return Pack(v, mem, n, limit, cap, from_end, [&](int, double t) {
    ++*groups;
    *slowest = std::max(*slowest, t);
  });
}

struct GreedyShape {
  int fused = 0;
  int stages = 0;
  double t_max = 0;
};
std::optional<GreedyShape> GreedyShapeAt(const LayerArrays& a, int L, double T, int64_t cap) {
  GreedyShape g;
  g.fused = MaxFused(a, L, T, cap);
  if (g.fused == 0) return std::nullopt;
  for (int j = L - g.fused; j < L; ++j) g.t_max += a.u[static_cast<size_t>(j)];
  g.stages = 1;
  const int n = L - g.fused;
  if (!PackCount(a.f, a.fm, n, T, cap, /*from_end=*/true, &g.stages, &g.t_max)) return std::nullopt;
  if (!PackCount(a.b, a.bm, n, T, cap, /*from_end=*/false, &g.stages, &g.t_max)) return std::nullopt;
  return g;
}

// The slot count a partition must reach: min_stages, where 2 means 3 (no partition has 2).
int RequiredStages(const PartitionProblem& pr) { return pr.min_stages == 2 ? 3 : pr.min_stages; }

// W (see MinimumTmax) for a checked problem. Every partition's B_1 holds the head and every
// layer below it sits in some stage, so W >= the head's fused time; the partition of one layer per
// slot has t_max = max(head's fused, every other layer's forward and backward) =: Wf and fits the
// cap (CheckProblem), so W <= Wf. W is a candidate sum in [head, Wf], and feasibility of the
// greedy packing grows with t_max: the first feasible one is W.
double MinimumTmaxOf(const LayerArrays& a, int L, int64_t cap) {
  const double head = a.u[static_cast<size_t>(L - 1)];
  double wf = head;
  for (int l = 0; l + 1 < L; ++l) wf = std::max({wf, a.f[static_cast<size_t>(l)], a.b[static_cast<size_t>(l)]});
  for (double T : Candidates(a, L, head, wf)) {
    if (auto g = GreedyShapeAt(a, L, T, cap)) return g->t_max;
  }
  return wf;
}

// The t_max range the problem allows: [W, window*W], or [0, inf) without a window.
struct TmaxRange {
  double lo = 0;
  double hi = std::numeric_limits<double>::infinity();
  bool Holds(double t) const { return t >= lo * (1 - kRelEps) && t <= hi * (1 + kRelEps); }
};
TmaxRange AllowedTmax(const PartitionProblem& pr, const LayerArrays& a, int L) {
  TmaxRange r;
  if (pr.t_max_window > 0) {
    r.lo = MinimumTmaxOf(a, L, pr.stage_memory_cap);
    r.hi = r.lo * pr.t_max_window;
  }
  return r;
}

// The best partition with exactly the required number of slots when min_stages asks for more than
// a greedy packing may give (PartitionWithStageCount: the smallest t_max with exactly K slots, so
// the best objective among them), if it exists inside the t_max range.
std::optional<PartitionResult> RequiredStagesPartition(const PartitionProblem& pr, const TmaxRange& range) {
  if (RequiredStages(pr) <= 1) return std::nullopt;
  auto r = PartitionWithStageCount(pr, RequiredStages(pr));
  if (!r.ok() || !range.Holds(r->t_max)) return std::nullopt;
  return *r;
}

}  // namespace

absl::StatusOr<double> MinimumTmax(const PartitionProblem& pr) {
  if (absl::Status st = CheckProblem(pr); !st.ok()) return st;
  const int L = pr.costs->num_layers();
  return MinimumTmaxOf(Arrays(*pr.costs), L, pr.stage_memory_cap);
}

bool PartitionAllowed(const PartitionProblem& pr, const PartitionResult& r) {
  if (r.partition.num_stages() < RequiredStages(pr)) return false;
  if (pr.t_max_window <= 0) return true;
  auto w = MinimumTmax(pr);
  return w.ok() && r.t_max >= *w * (1 - kRelEps) && r.t_max <= *w * pr.t_max_window * (1 + kRelEps);
}

std::vector<PartitionResult> CandidatePartitions(const PartitionProblem& pr, int max_candidates, int per_stage_count) {
  std::vector<PartitionResult> out;
  if (!CheckProblem(pr).ok()) return out;
  const int L = pr.costs->num_layers();
  const LayerArrays a = Arrays(*pr.costs);
  const TmaxRange range = AllowedTmax(pr, a, L);
  auto add = [&](const PartitionResult& r) {
    if (std::none_of(out.begin(), out.end(), [&](const PartitionResult& x) { return x.partition == r.partition; })) {
      out.push_back(r);
    }
  };
  for (double T : Candidates(a, L, range.lo, range.hi)) {
    auto p = GreedyAt(a, L, T, pr.stage_memory_cap);
    if (!p || p->num_stages() < RequiredStages(pr)) continue;
    auto r = EvaluatePartition(pr, *p);
    if (r.ok()) add(*r);
  }
  if (auto k = RequiredStagesPartition(pr, range)) add(*k);
  std::stable_sort(out.begin(), out.end(),
                   [](const PartitionResult& x, const PartitionResult& y) { return x.objective < y.objective; });
  if (per_stage_count > 0) {
    std::map<int, int> kept;  // stage count -> candidates kept
    std::vector<PartitionResult> thin;
    for (PartitionResult& r : out) {
      if (kept[r.partition.num_stages()]++ < per_stage_count) thin.push_back(std::move(r));
    }
    out = std::move(thin);
  }
  if (max_candidates > 0 && static_cast<int>(out.size()) > max_candidates)
    out.resize(static_cast<size_t>(max_candidates));
  return out;
}

absl::StatusOr<PartitionResult> AutoPartition(const PartitionProblem& pr) {
  if (absl::Status st = CheckProblem(pr); !st.ok()) return st;
  const int L = pr.costs->num_layers();
  const LayerArrays a = Arrays(*pr.costs);
  const double M = pr.num_microbatches, N = pr.num_workers;
  // The search needs only the candidates a greedy partition's own t_max can be (its t_max is a
  // candidate whose greedy partition is the same one), within two bounds that leave the optimum
  // and its ties in: t_max >= the head's fused time (B_1 always holds the head), and
  // (M*N + N(N-1)) * t_max <= the objective of any feasible partition — here the first one found
  // on a coarse geometric ladder from the lower bound. Most of the O(L^2) sums lie above that,
  // so they are neither sorted nor packed; the rest are packed without building partitions
  // (same optimum: the exhaustive tests hold; tests/bench/partitioner_bench for the times).
  // min_stages K: greedy shapes with fewer slots are skipped; the best partition with exactly K
  // slots (RequiredStagesPartition) stands in for them. That is exact: an optimum with more than K
  // slots has a greedy twin at its own t_max with no more slots and no larger t_max — one with at
  // least K slots is searched here, one with fewer can be split to K slots without raising t_max
  // — and an optimum with K slots has the least t_max of those. The window bounds T itself.
  const double K = pr.min_stages;
  const int need = RequiredStages(pr);
  const TmaxRange range = AllowedTmax(pr, a, L);
  const std::optional<PartitionResult> with_k = RequiredStagesPartition(pr, range);
  const double floor = M * std::max(N, K) + N * (N - 1);
  const double lo = std::max(a.u[static_cast<size_t>(L - 1)], range.lo);
  double best_bound = with_k ? with_k->objective : std::numeric_limits<double>::infinity();
  double total = 0;
  for (int l = 0; l < L; ++l)
    total += a.f[static_cast<size_t>(l)] + a.b[static_cast<size_t>(l)] + a.u[static_cast<size_t>(l)];
  auto objective = [&](const GreedyShape& g) {
    return (M * std::max({static_cast<double>(g.stages), N, K}) + N * (N - 1)) * g.t_max;
  };
  for (double T = std::max(lo, total / (4.0 * L)); T <= std::min(total, range.hi) * (1 + kRelEps); T *= 1.25) {
    if (auto g = GreedyShapeAt(a, L, T, pr.stage_memory_cap)) {
      if (g->stages >= need) best_bound = std::min(best_bound, objective(*g));
      break;
    }
  }
  const double hi = std::min(best_bound / floor, range.hi);
  // Candidates are compared by their shape alone (no partition is built); the winner is built
  // and evaluated once at the end.
  std::optional<GreedyShape> best;
  double best_T = 0, best_obj = 0;
  for (double T : Candidates(a, L, lo, hi)) {
    // Every partition counts at least N slots, so once (M*N + N(N-1)) * T exceeds the best value
    // no larger candidate can win (candidates ascend).
    if (best && floor * T > best_obj * (1 + kRelEps)) break;
    auto g = GreedyShapeAt(a, L, T, pr.stage_memory_cap);
    if (!g || g->stages < need) continue;
    const double obj = objective(*g);
    if (!best || obj < best_obj * (1 - kRelEps) ||
        (obj <= best_obj * (1 + kRelEps) &&
         (g->fused > best->fused || (g->fused == best->fused && g->t_max < best->t_max)))) {
      best = g;
      best_T = T;
      best_obj = obj;
    }
  }
  if (!best && !with_k) {
    return absl::ResourceExhaustedError("partition: no partition satisfies the per-stage memory cap");
  }
  if (!best) return *with_k;
  auto greedy = EvaluatePartition(pr, *GreedyAt(a, L, best_T, pr.stage_memory_cap));
  if (!greedy.ok() || !with_k) return greedy;
  const bool k_wins =
      with_k->objective < greedy->objective * (1 - kRelEps) ||
      (with_k->objective <= greedy->objective * (1 + kRelEps) && with_k->partition.fused > greedy->partition.fused);
  return k_wins ? *with_k : *greedy;
}

absl::StatusOr<PartitionResult> PartitionWithStageCount(const PartitionProblem& pr, int num_stages) {
  if (absl::Status st = CheckProblem(pr); !st.ok()) return st;
  const int L = pr.costs->num_layers();
  const int max_stages = 2 * L - 1;
  if (num_stages < 1 || num_stages == 2 || num_stages > max_stages) {
    return absl::InvalidArgumentError(absl::StrCat("partition: ", num_stages, " stage slots is impossible for ", L,
                                                   " layers (allowed: 1, or 3..", max_stages, ")"));
  }
  const LayerArrays a = Arrays(*pr.costs);
  const int fused_cap = num_stages == 1 ? L : L - (num_stages - 1 + 1) / 2;
  for (double T : Candidates(a, L)) {
    const int fused = std::min(MaxFused(a, L, T, pr.stage_memory_cap), fused_cap);
    if (fused < 1 || (num_stages == 1 && fused != L)) continue;
    const int n = L - fused;
    auto fwd = GreedyPack(a.f, a.fm, n, T, pr.stage_memory_cap, true);
    auto bwd = GreedyPack(a.b, a.bm, n, T, pr.stage_memory_cap, false);
    if (!fwd || !bwd) continue;
    const int have = 1 + static_cast<int>(fwd->size() + bwd->size());
    if (have > num_stages) continue;
    // Distribute the extra slots: split the slowest splittable stage of either direction.
    std::vector<int> f = *fwd, b = *bwd;
    std::vector<double> bwd_times(a.b.begin(), a.b.begin() + n);
    std::vector<double> fwd_times(a.f.begin(), a.f.begin() + n);
    while (1 + static_cast<int>(f.size() + b.size()) < num_stages) {
      auto slowest = [](const std::vector<int>& g, const std::vector<double>& v) {
        double best = -1;
        int first = 0;
        for (int c : g) {
          if (c > 1) best = std::max(best, GroupTime(v, first, c));
          first += c;
        }
        return best;
      };
      const double tf = slowest(f, fwd_times), tb = slowest(b, bwd_times);
      if (tf < 0 && tb < 0) break;
      if (tf >= tb) {
        SplitTo(f, fwd_times, static_cast<int>(f.size()) + 1);
      } else {
        SplitTo(b, bwd_times, static_cast<int>(b.size()) + 1);
      }
    }
    return EvaluatePartition(pr, MakePartition(f, fused, b));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("partition: no ", num_stages, "-slot partition satisfies the per-stage memory cap"));
}

absl::StatusOr<PartitionResult> BalancedPartition(const PartitionProblem& pr, const Partition& shape,
                                                  int forward_stages) {
  if (absl::Status st = CheckProblem(pr); !st.ok()) return st;
  const int L = pr.costs->num_layers();
  const int n = L - shape.fused;
  if (shape.fused < 1 || n < 0) return absl::InvalidArgumentError("partition: bad B_1 for balancing");
  if (n == 0) return EvaluatePartition(pr, shape);
  const LayerArrays a = Arrays(*pr.costs);
  auto side = [&](const std::vector<double>& t, const std::vector<int64_t>& m,
                  int k) -> absl::StatusOr<std::vector<int>> {
    return MinMaxContiguousPartition(std::vector<double>(t.begin(), t.begin() + n),
                                     std::vector<int64_t>(m.begin(), m.begin() + n), pr.stage_memory_cap, k);
  };
  auto fwd = side(a.f, a.fm, forward_stages > 0 ? forward_stages : shape.num_forward_stages());
  if (!fwd.ok()) return fwd.status();
  auto bwd = side(a.b, a.bm, shape.num_backward_stages() - 1);
  if (!bwd.ok()) return bwd.status();
  return EvaluatePartition(pr, MakePartition(*fwd, shape.fused, *bwd));
}

absl::StatusOr<std::vector<int>> MinMaxContiguousPartition(const std::vector<double>& w,
                                                           const std::vector<int64_t>& mem, int64_t cap,
                                                           int num_stages) {
  const int n = static_cast<int>(w.size());
  if (n == 0) return absl::InvalidArgumentError("partition: no layers");
  if (mem.size() != w.size()) return absl::InvalidArgumentError("partition: weights and memory differ in length");
  if (num_stages < 1 || num_stages > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition: cannot cut ", n, " layers into ", num_stages, " non-empty stages"));
  }
  std::vector<double> cand;
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int j = i; j < n; ++j) {
      s += w[static_cast<size_t>(j)];
      cand.push_back(s);
    }
  }
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
  // The greedy count is non-increasing in the limit: binary search the smallest feasible one.
  size_t lo = 0, hi = cand.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    auto g = GreedyPack(w, mem, n, cand[mid], cap, false);
    if (g && static_cast<int>(g->size()) <= num_stages) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  if (lo == cand.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("partition: no ", num_stages, "-stage partition satisfies the per-stage memory cap"));
  }
  std::vector<int> groups = *GreedyPack(w, mem, n, cand[lo], cap, false);
  SplitTo(groups, w, num_stages);
  return groups;
}

}  // namespace rp::planning
