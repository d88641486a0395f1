#include "scheduler/planning/cost_model.h"

#include <gtest/gtest.h>

#include "scheduler/planning/model_config.h"

namespace rp::planning {
namespace {

// Published parameter counts (model cards) are the independent reference for the presets.
TEST(ModelPresets, ParameterCountsMatchModelCards) {
  struct Want {
    const char* name;
    double billions;
    double tol;
  };
  for (const Want& w : {Want{"qwen3-1.7b", 1.72, 0.03},  // 1.4B non-embedding + 0.31B tied embedding
                        Want{"llama-3.1-8b", 8.03, 0.02}, Want{"qwen3-32b", 32.8, 0.1}, Want{"gpt-oss-20b", 20.9, 0.2},
                        Want{"qwen3-235b-a22b", 235.1, 1.0}}) {
    auto m = ModelPreset(w.name);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_NEAR(m->TotalParams() / 1e9, w.billions, w.tol) << w.name;
  }
  // Qwen3-1.7B: 1.4B non-embedding parameters per its model card.
  auto q = *ModelPreset("Qwen3-1.7B");
  EXPECT_NEAR((q.TotalParams() - q.EmbeddingParams()) / 1e9, 1.4, 0.05);
}

TEST(ModelPresets, UnknownNamesListTheKnownOnes) {
  auto m = ModelPreset("gpt-5");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("qwen3-1.7b"), std::string::npos);
  auto d = DevicePreset("tpu");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("rtx4090"), std::string::npos);
}

TEST(AnalyticCostModel, LayersAndRatiosAreSane) {
  auto m = *ModelPreset("qwen3-1.7b");
  auto d = *DevicePreset("rtx4090");
  auto c = AnalyticCostModel(m, d, {});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->num_layers(), m.num_blocks + 2);
  EXPECT_EQ(c->layers.front().kind, LayerKind::kEmbedding);
  EXPECT_EQ(c->layers.back().kind, LayerKind::kHead);
  const LayerCost& block = c->layers[1];
  const LayerCost& head = c->layers.back();
  // The 152K-vocabulary head of a 2048-wide model outweighs a decoder block (the imbalance the
  // paper's schedule is built around).
  EXPECT_GT(head.fwd_s, block.fwd_s);
  // Backward with recompute ~ 3x forward for dense layers (forward + 2x backward).
  EXPECT_GT(block.bwd_s / block.fwd_s, 2.5);
  EXPECT_LT(block.bwd_s / block.fwd_s, 3.6);
  // A block of Qwen3-1.7B on an RTX 4090 at 8192 tokens: 2 * 50.3M params * 8192 tokens =
  // 824 GFLOP at ~70% of 165 TFLOP/s is ~7 ms, plus attention and elementwise work.
  EXPECT_GT(block.fwd_s, 6e-3);
  EXPECT_LT(block.fwd_s, 12e-3);
  EXPECT_EQ(block.param_bytes, m.BlockParams() * 2);
}

TEST(AnalyticCostModel, LoraFreezesTheBase) {
  auto m = *ModelPreset("qwen3-235b-a22b");
  auto c = *AnalyticCostModel(m, *DevicePreset("rtx4090"), {});
  EXPECT_EQ(c.layers.front().trainable_bytes, 0);
  EXPECT_EQ(c.layers[1].trainable_bytes, m.BlockLoraParams() * 2);
  EXPECT_LT(c.layers[1].bwd_s / c.layers[1].fwd_s, 2.6);  // no weight gradients for the base
}

TEST(AnalyticCostModel, RejectsBadConfigs) {
  ModelConfig m = *ModelPreset("llama-3.1-8b");
  m.intermediate = 0;
  EXPECT_FALSE(AnalyticCostModel(m, *DevicePreset("a800"), {}).ok());
  m = *ModelPreset("gpt-oss-20b");
  m.active_experts = 64;
  EXPECT_FALSE(AnalyticCostModel(m, *DevicePreset("a800"), {}).ok());
  AnalyticOptions o;
  o.sequence_length = 0;
  EXPECT_FALSE(AnalyticCostModel(*ModelPreset("qwen3-32b"), *DevicePreset("h200"), o).ok());
}

TEST(MeasuredProfile, BiasCorrectedEmaSkipsWarmup) {
  MeasuredProfile p(2, 0.9, 1);
  p.Record(0, MeasuredProfile::Kind::kForward, 100.0);  // dropped (warm-up)
  EXPECT_EQ(p.Samples(0, MeasuredProfile::Kind::kForward), 0);
  p.Record(0, MeasuredProfile::Kind::kForward, 2.0);
  p.Record(0, MeasuredProfile::Kind::kBackward, 99.0);  // dropped
  p.Record(0, MeasuredProfile::Kind::kBackward, 6.0);
  EXPECT_FALSE(p.Complete());
  p.Record(1, MeasuredProfile::Kind::kForward, 0);
  p.Record(1, MeasuredProfile::Kind::kForward, 1.0);
  p.Record(1, MeasuredProfile::Kind::kFused, 0);
  p.Record(1, MeasuredProfile::Kind::kFused, 3.0);
  p.Record(1, MeasuredProfile::Kind::kFused, 5.0);
  EXPECT_TRUE(p.Complete());
  CostModel base = SyntheticCostModel(2, 1.0);
  CostModel got = p.Apply(base);
  // One sample: bias correction makes the estimate the sample itself.
  EXPECT_DOUBLE_EQ(got.layers[0].fwd_s, 2.0);
  EXPECT_DOUBLE_EQ(got.layers[0].bwd_s, 6.0);
  EXPECT_DOUBLE_EQ(got.layers[0].fused_s, 6.0);  // falls back to the backward estimate
  // Two samples 3 then 5 with alpha 0.9: (0.09*3 + 0.1*5) / (1 - 0.81).
  EXPECT_NEAR(got.layers[1].fused_s, (0.9 * 0.1 * 3 + 0.1 * 5) / (1 - 0.81), 1e-12);
  EXPECT_NEAR(got.layers[1].bwd_s, got.layers[1].fused_s, 1e-12);
  // Out-of-range and non-finite samples are ignored.
  p.Record(7, MeasuredProfile::Kind::kForward, 1.0);
  p.Record(0, MeasuredProfile::Kind::kForward, -1.0);
  EXPECT_EQ(p.Samples(0, MeasuredProfile::Kind::kForward), 1);
}

}  // namespace
}  // namespace rp::planning
