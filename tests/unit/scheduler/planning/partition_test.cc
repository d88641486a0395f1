#include "scheduler/planning/partition.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <optional>
#include <random>

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
  std::uniform_real_distribution<double> t(0.5, 3.0);
  for (int trial = 0; trial < 60; ++trial) {
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
