#include "scheduler/planning/partition.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace rp::planning {
namespace {

// Integer-valued times keep every sum exact, so optimal values compare exactly.
CostModel RandomCosts(std::mt19937& rng, int L) {
  std::uniform_int_distribution<int> t(1, 9), mem(1, 6);
  CostModel c;
  for (int l = 0; l < L; ++l) {
    LayerCost x;
    x.fwd_s = t(rng);
    x.bwd_s = x.fwd_s + t(rng) + t(rng);
    x.fused_s = x.bwd_s - (rng() % 2);  // fused is sometimes a bit cheaper
    x.param_bytes = mem(rng);
    x.trainable_bytes = mem(rng);
    c.layers.push_back(x);
  }
  return c;
}

// A large model of real-valued times (20..99 layers) with a heavy head, as the paper's models
// have: what the exhaustive tests cannot reach.
CostModel LargeRandomCosts(std::mt19937& rng) {
  std::uniform_real_distribution<double> t(0.5, 3.0);
  const int L = 20 + static_cast<int>(rng() % 80);
  CostModel c;
  for (int l = 0; l < L; ++l) {
    LayerCost x;
    x.fwd_s = t(rng);
    x.bwd_s = x.fwd_s * (2 + t(rng) / 3);
    x.fused_s = x.bwd_s * (l == L - 1 ? 4 : 1);  // a heavy head
    x.param_bytes = 1 + static_cast<int64_t>(rng() % 6);
    x.trainable_bytes = x.param_bytes;
    c.layers.push_back(x);
  }
  return c;
}

// All compositions of n into positive parts (n == 0: the empty one).
void Compositions(int n, const std::function<void(const std::vector<int>&)>& fn) {
  if (n == 0) {
    fn({});
    return;
  }
  for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
    std::vector<int> parts;
    int run = 1;
    for (int i = 0; i < n - 1; ++i) {
      if (mask & (1u << i)) {
        parts.push_back(run);
        run = 1;
      } else {
        ++run;
      }
    }
    parts.push_back(run);
    fn(parts);
  }
}

// Exhaustive search over every (forward, B_1, backward) partition: the reference.
// stage_count > 0 restricts to exactly that many slots and minimizes t_max instead.
std::optional<PartitionResult> BruteForce(const PartitionProblem& pr, int stage_count = 0) {
  const int L = pr.costs->num_layers();
  std::optional<PartitionResult> best;
  for (int b = 1; b <= L; ++b) {
    Compositions(L - b, [&](const std::vector<int>& f) {
      Compositions(L - b, [&](const std::vector<int>& bw) {
        Partition p{f, b, bw};
        if (stage_count > 0 && p.num_stages() != stage_count) return;
        auto r = EvaluatePartition(pr, p);
        if (!r.ok()) return;
        const double key = stage_count > 0 ? r->t_max : r->objective;
        const double best_key = !best ? 0 : (stage_count > 0 ? best->t_max : best->objective);
        if (!best || key < best_key || (key == best_key && p.fused > best->partition.fused)) best = *r;
      });
    });
  }
  return best;
}

TEST(AutoPartition, EqualsExhaustiveSearchOnRandomInstances) {
  std::mt19937 rng(12345);
  int compared = 0, with_cap = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 8);
    CostModel c = RandomCosts(rng, L);
    PartitionProblem pr{&c, 1 + static_cast<int>(rng() % 6), 1 + static_cast<int>(rng() % 24), 0};
    if (trial % 2 == 1) {
      pr.stage_memory_cap = 12 + static_cast<int64_t>(rng() % 20);
      ++with_cap;
    }
    auto want = BruteForce(pr);
    auto got = AutoPartition(pr);
    if (!want) {
      EXPECT_FALSE(got.ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(got.ok()) << "trial " << trial << ": " << got.status();
    EXPECT_DOUBLE_EQ(got->objective, want->objective)
        << "trial " << trial << " got " << got->partition.ToString() << " want " << want->partition.ToString();
    EXPECT_EQ(got->partition.fused, want->partition.fused) << "trial " << trial;
    ++compared;
  }
  EXPECT_GT(compared, 300);
  EXPECT_GT(with_cap, 150);
}

// Beyond exhaustive sizes: the pruned search (bounds on t_max, shapes compared without building
// partitions) equals the unpruned one — every candidate t_max's greedy partition, evaluated in
// full (CandidatePartitions) — on large random models with real-valued times, with and without a
// memory cap: the same objective, and among equal objectives the same largest B_1.
TEST(AutoPartition, EqualsTheUnprunedSearchOnLargeModels) {
  std::mt19937 rng(777);
  for (int trial = 0; trial < 60; ++trial) {
    CostModel c = LargeRandomCosts(rng);
    PartitionProblem pr{&c, 1 + static_cast<int>(rng() % 8), 1 + static_cast<int>(rng() % 32), 0};
    if (trial % 2 == 1) pr.stage_memory_cap = 30 + static_cast<int64_t>(rng() % 60);
    auto got = AutoPartition(pr);
    const std::vector<PartitionResult> all = CandidatePartitions(pr);  // objective order
    if (all.empty()) {
      EXPECT_FALSE(got.ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(got.ok()) << "trial " << trial << ": " << got.status();
    EXPECT_NEAR(got->objective, all.front().objective, 1e-9 * all.front().objective) << "trial " << trial;
    int fused = 0;
    for (const PartitionResult& r : all) {
      if (r.objective <= all.front().objective * (1 + 1e-9)) fused = std::max(fused, r.partition.fused);
    }
    EXPECT_EQ(got->partition.fused, fused) << "trial " << trial;
  }
}

// The brute force under the authors' knobs: every partition with at least `min_stages` slots
// whose t_max lies in [W, window*W], W the least t_max of all partitions (brute-forced too).
struct KnobsReference {
  std::optional<PartitionResult> best;
  double w = 0;
};
KnobsReference BruteForceWithKnobs(const PartitionProblem& pr) {
  KnobsReference ref;
  const int L = pr.costs->num_layers();
  const int need = pr.min_stages == 2 ? 3 : pr.min_stages;
  std::vector<PartitionResult> all;
  for (int b = 1; b <= L; ++b) {
    Compositions(L - b, [&](const std::vector<int>& f) {
      Compositions(L - b, [&](const std::vector<int>& bw) {
        auto r = EvaluatePartition(pr, Partition{f, b, bw});
        if (r.ok()) all.push_back(*r);
      });
    });
  }
  if (all.empty()) return ref;
  ref.w = std::numeric_limits<double>::infinity();
  for (const PartitionResult& r : all) ref.w = std::min(ref.w, r.t_max);
  for (const PartitionResult& r : all) {
    if (r.partition.num_stages() < need) continue;
    if (pr.t_max_window > 0 && r.t_max > ref.w * pr.t_max_window) continue;
    if (!ref.best || r.objective < ref.best->objective ||
        (r.objective == ref.best->objective && r.partition.fused > ref.best->partition.fused)) {
      ref.best = r;
    }
  }
  return ref;
}

// min_stages and the t_max window: exact against exhaustive search (objective and B_1), with and
// without a memory cap, on costs where the fused time is sometimes below the forward time (so the
// least t_max W is not simply the largest single layer).
TEST(AutoPartition, MinStagesAndTmaxWindowEqualExhaustiveSearch) {
  std::mt19937 rng(4242);
  int compared = 0, raised = 0, windowed = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 7);
    CostModel c = RandomCosts(rng, L);
    if (trial % 3 == 2) {
      for (LayerCost& x : c.layers) x.fused_s = 1 + static_cast<double>(rng() % 12);
    }
    PartitionProblem pr{&c, 1 + static_cast<int>(rng() % 6), 1 + static_cast<int>(rng() % 24), 0};
    if (trial % 2 == 1) pr.stage_memory_cap = 12 + static_cast<int64_t>(rng() % 20);
    pr.min_stages = static_cast<int>(rng() % (2 * L));  // 0..2L-1
    if (trial % 4 != 0) pr.t_max_window = std::vector<double>{1.0, 1.1, 1.5, 2.0}[rng() % 4];
    const KnobsReference want = BruteForceWithKnobs(pr);
    auto got = AutoPartition(pr);
    if (want.w > 0) {
      auto w = MinimumTmax(pr);
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_DOUBLE_EQ(*w, want.w) << "trial " << trial;
    }
    if (!want.best) {
      EXPECT_FALSE(got.ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(got.ok()) << "trial " << trial << ": " << got.status();
    EXPECT_DOUBLE_EQ(got->objective, want.best->objective)
        << "trial " << trial << " K=" << pr.min_stages << " X=" << pr.t_max_window << " got "
        << got->partition.ToString() << " want " << want.best->partition.ToString();
    EXPECT_EQ(got->partition.fused, want.best->partition.fused) << "trial " << trial;
    EXPECT_TRUE(PartitionAllowed(pr, *got)) << "trial " << trial;
    ++compared;
    PartitionProblem plain = pr;
    plain.min_stages = 0;
    plain.t_max_window = 0;
    auto free = AutoPartition(plain);
    if (free.ok() && free->partition.num_stages() < pr.min_stages) ++raised;
    if (free.ok() && pr.t_max_window > 0 && free->t_max > want.w * pr.t_max_window) ++windowed;
  }
  EXPECT_GT(compared, 200);
  EXPECT_GT(raised, 40);    // the knob changed the answer that often
  EXPECT_GT(windowed, 10);  // and so did the window
}

// The window keeps exactly the candidates inside it: the windowed candidate set equals the
// unwindowed one filtered to [W, X*W], on large models with real-valued times.
TEST(AutoPartition, TmaxWindowKeepsExactlyTheCandidatesInsideIt) {
  std::mt19937 rng(31337);
  for (int trial = 0; trial < 30; ++trial) {
    CostModel c = LargeRandomCosts(rng);
    PartitionProblem pr{&c, 8, 16, 0};
    const auto all = CandidatePartitions(pr);
    pr.t_max_window = 1.1 + 0.1 * (trial % 5);
    const auto inside = CandidatePartitions(pr);
    const double w = *MinimumTmax(pr);
    std::vector<std::string> want, got;
    for (const PartitionResult& r : all) {
      if (r.t_max <= w * pr.t_max_window * (1 + 1e-9)) want.push_back(r.partition.ToString());
    }
    for (const PartitionResult& r : inside) got.push_back(r.partition.ToString());
    EXPECT_EQ(got, want) << "trial " << trial;
    EXPECT_FALSE(got.empty());
    auto best = AutoPartition(pr);
    ASSERT_TRUE(best.ok());
    ASSERT_FALSE(inside.empty());
    EXPECT_NEAR(best->objective, inside.front().objective, 1e-9 * best->objective) << "trial " << trial;
  }
}

TEST(PartitionWithStageCount, MinimizesTmaxForExactSlotCount) {
  std::mt19937 rng(777);
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 2 + static_cast<int>(rng() % 6);
    CostModel c = RandomCosts(rng, L);
    PartitionProblem pr{&c, 4, 8, trial % 3 == 0 ? 20 : 0};
    const int S = 3 + static_cast<int>(rng() % (2 * L - 3));
    auto want = BruteForce(pr, S);
    auto got = PartitionWithStageCount(pr, S);
    if (!want) {
      EXPECT_FALSE(got.ok());
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->partition.num_stages(), S);
    EXPECT_DOUBLE_EQ(got->t_max, want->t_max) << "trial " << trial << " S=" << S;
  }
}

TEST(PartitionWithStageCount, RejectsImpossibleCounts) {
  CostModel c = SyntheticCostModel(4, 2.0);
  PartitionProblem pr{&c, 2, 4, 0};
  EXPECT_FALSE(PartitionWithStageCount(pr, 2).ok());
  EXPECT_FALSE(PartitionWithStageCount(pr, 8).ok());  // max is 2L-1 = 7
  EXPECT_FALSE(PartitionWithStageCount(pr, 0).ok());
  auto one = PartitionWithStageCount(pr, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->partition.fused, 4);
  auto seven = PartitionWithStageCount(pr, 7);
  ASSERT_TRUE(seven.ok());
  EXPECT_EQ(seven->partition, (Partition{{1, 1, 1}, 1, {1, 1, 1}}));
}

TEST(EvaluatePartition, ClearErrorsForInconsistentUserPartitions) {
  CostModel c = SyntheticCostModel(6, 2.0);
  PartitionProblem pr{&c, 2, 4, 0};
  auto bad_sum = EvaluatePartition(pr, Partition{{2, 2}, 1, {2, 3}});
  ASSERT_FALSE(bad_sum.ok());
  EXPECT_NE(bad_sum.status().message().find("forward stages cover 4 layers"), std::string::npos) << bad_sum.status();
  auto bad_bwd = EvaluatePartition(pr, Partition{{3, 2}, 1, {2, 2}});
  ASSERT_FALSE(bad_bwd.ok());
  EXPECT_NE(bad_bwd.status().message().find("backward stages cover 4"), std::string::npos);
  auto zero = EvaluatePartition(pr, Partition{{5, 0}, 1, {5}});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("F_2 has 0 layers"), std::string::npos);
  auto no_b1 = EvaluatePartition(pr, Partition{{6}, 0, {6}});
  EXPECT_FALSE(no_b1.ok());
  auto good = EvaluatePartition(pr, Partition{{3, 2}, 1, {2, 3}});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->partition.num_stages(), 5);
}

TEST(AutoPartition, ClearErrorsForBadProblems) {
  CostModel empty;
  EXPECT_EQ(AutoPartition({&empty, 2, 4, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  CostModel c = SyntheticCostModel(5, 2.0);
  EXPECT_EQ(AutoPartition({&c, 0, 4, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AutoPartition({&c, 2, 0, 0}).status().code(), absl::StatusCode::kInvalidArgument);
  // A layer larger than the cap: 400 MiB params + 800 MiB grads per layer, cap 1 GiB.
  auto big = AutoPartition({&c, 2, 4, int64_t{1} << 30});
  ASSERT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("layer 0 alone needs"), std::string::npos) << big.status();
  // The knobs: min_stages beyond 2L-1 = 9 slots, a window below 1 or not a number.
  PartitionProblem knobs{&c, 2, 4, 0};
  knobs.min_stages = 10;
  auto many = AutoPartition(knobs);
  ASSERT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(many.status().message().find("min_stages 10 is outside 0..9"), std::string::npos) << many.status();
  knobs.min_stages = -1;
  EXPECT_EQ(AutoPartition(knobs).status().code(), absl::StatusCode::kInvalidArgument);
  knobs.min_stages = 9;
  auto nine = AutoPartition(knobs);
  ASSERT_TRUE(nine.ok()) << nine.status();
  EXPECT_EQ(nine->partition.num_stages(), 9);
  knobs.min_stages = 0;
  for (double bad : {0.5, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    knobs.t_max_window = bad;
    auto r = AutoPartition(knobs);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("t_max_window"), std::string::npos) << r.status();
  }
  c.layers[2].fwd_s = std::numeric_limits<double>::quiet_NaN();
  EXPECT_FALSE(AutoPartition({&c, 2, 4, 0}).ok());
}

TEST(AutoPartition, MemoryCapForcesMoreStages) {
  CostModel c = SyntheticCostModel(12, 3.0);
  auto free = *AutoPartition({&c, 4, 8, 0});
  const int64_t per_layer = c.BackwardMemory(5);
  auto capped = *AutoPartition({&c, 4, 8, 2 * per_layer});
  EXPECT_GE(capped.partition.num_stages(), free.partition.num_stages());
  for (const StageShape& s : DescribeStages(capped.partition, c)) EXPECT_LE(s.memory_bytes, 2 * per_layer);
}

TEST(MinMaxContiguousPartition, EqualsExhaustiveSearch) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 9);
    std::vector<double> w;
    std::vector<int64_t> m;
    for (int i = 0; i < n; ++i) {
      w.push_back(1 + static_cast<double>(rng() % 20));
      m.push_back(1 + static_cast<int64_t>(rng() % 5));
    }
    const int k = 1 + static_cast<int>(rng() % n);
    const int64_t cap = trial % 2 ? 8 : 0;
    double want = std::numeric_limits<double>::infinity();
    Compositions(n, [&](const std::vector<int>& parts) {
      if (static_cast<int>(parts.size()) != k) return;
      double mx = 0;
      int first = 0;
      for (int p : parts) {
        double s = 0;
        int64_t ms = 0;
        for (int i = first; i < first + p; ++i) {
          s += w[static_cast<size_t>(i)];
          ms += m[static_cast<size_t>(i)];
        }
        if (cap > 0 && ms > cap) return;
        mx = std::max(mx, s);
        first += p;
      }
      want = std::min(want, mx);
    });
    auto got = MinMaxContiguousPartition(w, m, cap, k);
    if (want == std::numeric_limits<double>::infinity()) {
      EXPECT_FALSE(got.ok());
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(static_cast<int>(got->size()), k);
    double mx = 0;
    int first = 0;
    for (int p : *got) {
      double s = 0;
      for (int i = first; i < first + p; ++i) s += w[static_cast<size_t>(i)];
      mx = std::max(mx, s);
      first += p;
    }
    EXPECT_EQ(first, n);
    EXPECT_DOUBLE_EQ(mx, want) << "trial " << trial;
  }
}

}  // namespace
}  // namespace rp::planning
