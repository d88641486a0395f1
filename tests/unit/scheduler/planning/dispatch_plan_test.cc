#include "scheduler/planning/dispatch_plan.h"

#include <gtest/gtest.h>

#include <map>

namespace rp::planning {
namespace {

const Partition kPart{{3, 2}, 2, {1, 2, 2}};  // 7 layers, S = 2 + 1 + 3 = 6

TEST(DispatchPlan, SlotToWorkerIsRoundRobinAndG0CarriesOver) {
  DispatchOptions o;
  o.num_workers = 4;
  o.microbatches_per_iteration = 8;
  o.microbatches_per_round = 4;
  o.iterations = 3;
  o.g0 = 1;
  auto plan = BuildDispatchPlan(kPart, 7, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int S = 6;
  ASSERT_EQ(plan->slots.size(), static_cast<size_t>(3 * 2 * S));
  ASSERT_EQ(plan->rounds_per_iteration, 2);
  int g0 = 1;
  for (int it = 0; it < 3; ++it) {
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < S; ++i) {
        const StageSlot& s = plan->slots[static_cast<size_t>((it * 2 + r) * S + i)];
        EXPECT_EQ(s.iteration, it);
        EXPECT_EQ(s.round, r);
        EXPECT_EQ(s.slot_in_round, i);
        EXPECT_EQ(s.worker, (g0 + i) % 4) << "it " << it << " round " << r << " slot " << i;
        EXPECT_EQ(s.first_microbatch, r * 4);
        EXPECT_EQ(s.num_microbatches, 4);
      }
      g0 = (g0 + S) % 4;  // never reset, also not at iteration boundaries
    }
  }
  EXPECT_EQ(plan->next_g0, g0);
  // Consecutive slots of the whole sequence land on consecutive workers.
  for (size_t i = 1; i < plan->slots.size(); ++i) {
    EXPECT_EQ(plan->slots[i].worker, (plan->slots[i - 1].worker + 1) % 4);
  }
}

TEST(DispatchPlan, EveryMicrobatchAndLayerRunsForwardAndBackwardOnce) {
  DispatchOptions o;
  o.num_workers = 3;
  o.microbatches_per_iteration = 6;
  o.microbatches_per_round = 3;
  o.iterations = 2;
  auto plan = *BuildDispatchPlan(kPart, 7, o);
  std::map<std::tuple<int, int, int>, int> fwd, bwd;  // (iteration, mb, layer) -> count
  for (const StageSlot& s : plan.slots) {
    for (int m = s.first_microbatch; m < s.first_microbatch + s.num_microbatches; ++m) {
      for (int l = s.first_layer; l < s.first_layer + s.num_layers; ++l) {
        if (s.kind != spec::StageKind::kBackward) ++fwd[{s.iteration, m, l}];
        if (s.kind != spec::StageKind::kForward) ++bwd[{s.iteration, m, l}];
      }
    }
  }
  EXPECT_EQ(fwd.size(), 2u * 6 * 7);
  EXPECT_EQ(bwd.size(), 2u * 6 * 7);
  for (const auto& [k, n] : fwd) EXPECT_EQ(n, 1);
  for (const auto& [k, n] : bwd) EXPECT_EQ(n, 1);
}

TEST(DispatchPlan, DependenciesPointBackwardsAndFollowTheDataFlow) {
  DispatchOptions o;
  o.num_workers = 2;
  o.microbatches_per_iteration = 2;
  auto plan = *BuildDispatchPlan(kPart, 7, o);
  for (const StageSlot& s : plan.slots) {
    for (const SlotDependency& d : s.deps) {
      ASSERT_LT(d.slot, s.index);
      const StageSlot& p = plan.slots[static_cast<size_t>(d.slot)];
      EXPECT_EQ(p.round, s.round);
      EXPECT_EQ(p.iteration, s.iteration);
      switch (d.reason) {
        case SlotDependency::Reason::kActivation:  // producer ends where the consumer starts
          EXPECT_EQ(p.first_layer + p.num_layers, s.first_layer);
          break;
        case SlotDependency::Reason::kGradient:  // gradient flows from the layers above
          EXPECT_EQ(s.first_layer + s.num_layers, p.first_layer);
          break;
        case SlotDependency::Reason::kCheckpoint:  // the forward slot that computed first_layer-1
          EXPECT_EQ(p.kind, spec::StageKind::kForward);
          EXPECT_LE(p.first_layer, s.first_layer - 1);
          EXPECT_GT(p.first_layer + p.num_layers, s.first_layer - 1);
          break;
      }
    }
  }
  // Slot layout: F_1 [0,3), F_2 [3,5), B_1 [5,7), B_2 [4,5), B_3 [2,4), B_4 [0,2).
  ASSERT_EQ(plan.slots.size(), 6u);
  EXPECT_EQ(plan.slots[2].kind, spec::StageKind::kFused);
  EXPECT_EQ(plan.slots[2].first_layer, 5);
  EXPECT_EQ(plan.slots[3].first_layer, 4);
  EXPECT_EQ(plan.slots[4].first_layer, 2);
  EXPECT_EQ(plan.slots[5].first_layer, 0);
  // B_3 starts at layer 2, whose input was produced by F_1 (layers 0..2) -> checkpoint edge.
  bool has_ckpt = false;
  for (const auto& d : plan.slots[4].deps) has_ckpt |= d.reason == SlotDependency::Reason::kCheckpoint && d.slot == 0;
  EXPECT_TRUE(has_ckpt);
}

TEST(DispatchPlan, ClearErrors) {
  DispatchOptions o;
  o.num_workers = 4;
  o.microbatches_per_iteration = 8;
  o.microbatches_per_round = 3;  // M_R < N
  auto a = BuildDispatchPlan(kPart, 7, o);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("M_R=3 < N=4"), std::string::npos) << a.status();
  o.microbatches_per_round = 5;  // 8 % 5 != 0
  auto b = BuildDispatchPlan(kPart, 7, o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("multiple of M_R"), std::string::npos);
  o.microbatches_per_round = 4;
  EXPECT_FALSE(BuildDispatchPlan(kPart, 8, o).ok());  // partition covers 7 layers
  o.num_workers = 0;
  EXPECT_FALSE(BuildDispatchPlan(kPart, 7, o).ok());
  o.num_workers = 4;
  o.g0 = 4;
  EXPECT_FALSE(BuildDispatchPlan(kPart, 7, o).ok());
}

}  // namespace
}  // namespace rp::planning
