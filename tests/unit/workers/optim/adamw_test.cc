#include "workers/optim/adamw.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <cmath>

namespace rp::workers {
namespace {

spec::ModelConfig Tiny() {
  spec::ModelConfig c;
  c.vocab = 11;
  c.hidden = 8;
  c.intermediate = 12;
  c.num_blocks = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  return c;
}

// Our AdamW + clipping against torch::optim::AdamW + clip_grad_norm_ on the same gradients.
TEST(AdamW, MatchesTorchAdamWWithClipping) {
  for (double max_norm : {0.0, 0.05}) {
    HostModelStore store(Tiny(), at::kBFloat16, 5);
    std::vector<at::Tensor> ref;
    for (int i = 0; i < store.num_params(); ++i) ref.push_back(store.param(i).fp32.clone().set_requires_grad(true));
    AdamWOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.1;
    o.max_grad_norm = max_norm;
    AdamW ours(o);
    torch::optim::AdamW theirs(ref, torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
    for (int step = 0; step < 4; ++step) {
      theirs.zero_grad();
      store.ZeroGrads();
      for (int i = 0; i < store.num_params(); ++i) {
        at::Tensor g = at::randn(store.param(i).fp32.sizes(), gen, at::kFloat) * 0.1;
        store.AccumulateGrad(i, g);
        ref[static_cast<size_t>(i)].mutable_grad() = g.clone();
      }
      double want_norm = 0;
      for (auto& r : ref) want_norm += r.grad().pow(2).sum().item<double>();
      want_norm = std::sqrt(want_norm);
      if (max_norm > 0) torch::nn::utils::clip_grad_norm_(ref, max_norm);
      theirs.step();
      auto norm = ours.Step(store, o.lr);
      ASSERT_TRUE(norm.ok()) << norm.status();
      EXPECT_NEAR(*norm, want_norm, 1e-5 * want_norm);
    }
    for (int i = 0; i < store.num_params(); ++i) {
      EXPECT_TRUE(at::allclose(store.param(i).fp32, ref[static_cast<size_t>(i)], 1e-6, 1e-7)) << store.param(i).name;
      // The bf16 master copy is the rounded fp32 copy.
      EXPECT_TRUE(at::equal(store.param(i).master, store.param(i).fp32.to(at::kBFloat16)));
    }
  }
}

TEST(HostModelStore, MasterCopyNeverAliasesTheOptimizerCopy) {
  // A regression: Tensor::to() returns the same tensor for an fp32 master, which let the async
  // optimizer's step leak into weights an in-flight iteration was still uploading.
  HostModelStore store(Tiny(), at::kFloat, 5);
  for (int i = 0; i < store.num_params(); ++i) {
    EXPECT_NE(store.param(i).master.data_ptr(), store.param(i).fp32.data_ptr()) << store.param(i).name;
  }
}

TEST(AdamW, NonFiniteGradientsAreRejectedWithoutTouchingWeights) {
  HostModelStore store(Tiny(), at::kFloat, 5);
  at::Tensor before = store.param(0).fp32.clone();
  store.AccumulateGrad(0, at::full(store.param(0).fp32.sizes(), NAN));
  AdamW opt({});
  auto r = opt.Step(store, 1e-3);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(at::equal(before, store.param(0).fp32));
  EXPECT_EQ(opt.steps(), 0);
}

TEST(LrSchedule, WarmupThenCosine) {
  spec::LrSchedule s{spec::LrSchedule::Kind::kWarmupCosine, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(s.At(1.0, 1), 0.1);
  EXPECT_DOUBLE_EQ(s.At(1.0, 10), 1.0);
  EXPECT_NEAR(s.At(1.0, 60), 0.1 + 0.9 * 0.5, 1e-12);  // half-way through the decay
  EXPECT_NEAR(s.At(1.0, 110), 0.1, 1e-12);
  EXPECT_NEAR(s.At(1.0, 500), 0.1, 1e-12);
  EXPECT_DOUBLE_EQ(spec::LrSchedule{}.At(0.3, 77), 0.3);
}

}  // namespace
}  // namespace rp::workers

namespace rp::workers {
namespace {

TEST(HostModelStore, FrozenParametersKeepOnlyTheMasterCopy) {
  HostModelStore store(Tiny(), at::kBFloat16, 5);
  const int64_t before = store.HostBytes();
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  ASSERT_TRUE(store.Freeze(name).ok());
  const HostParam& p = store.param(store.FindParam(name));
  EXPECT_FALSE(p.trainable);
  EXPECT_FALSE(p.fp32.defined());
  EXPECT_FALSE(p.grad.defined());
  EXPECT_EQ(p.master.scalar_type(), at::kBFloat16);
  EXPECT_EQ(before - store.HostBytes(), 8 * static_cast<int64_t>(p.master.numel()));  // fp32 copy + fp32 grad
  at::Tensor frozen = p.master.clone();
  AdamW opt({});
  for (int i = 0; i < store.num_params(); ++i) {
    if (store.param(i).trainable) store.AccumulateGrad(i, at::ones(store.param(i).shape));
  }
  ASSERT_TRUE(opt.Step(store, 0.1).ok());
  EXPECT_TRUE(at::equal(frozen, p.master));  // the optimizer never touches it
  EXPECT_FALSE(store.Freeze("nope").ok());
  auto bad = store.SetValue("model.norm.weight", at::ones({3}));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("shape [3] does not match [8]"), std::string::npos) << bad;
}

}  // namespace
}  // namespace rp::workers

#include "workers/optim/step_policy.h"

namespace rp::workers {
namespace {

// The one step policy both optimizer modes use: unscale, clip like
// torch.nn.utils.clip_grad_norm_ (max / (norm + 1e-6)), skip on fp16 overflow, refuse non-finite
// gradients without a loss scaler.
TEST(StepPolicy, UnscalesClipsSkipsAndRefuses) {
  StepDecision d = DecideStep(/*scaled_norm=*/8.0, /*loss_scale=*/4.0, /*max_grad_norm=*/0, nullptr);
  EXPECT_TRUE(d.apply);
  EXPECT_DOUBLE_EQ(d.grad_norm, 2.0);
  EXPECT_DOUBLE_EQ(d.multiplier, 0.25);
  d = DecideStep(40.0, 4.0, 1.0, nullptr);  // norm 10 > 1: clipped
  EXPECT_DOUBLE_EQ(d.grad_norm, 10.0);
  EXPECT_DOUBLE_EQ(d.multiplier, 0.25 * 1.0 / (10.0 + 1e-6));
  d = DecideStep(0.5, 1.0, 1.0, nullptr);  // below the clip: untouched
  EXPECT_DOUBLE_EQ(d.multiplier, 1.0);
  d = DecideStep(std::nan(""), 1.0, 0, nullptr);
  EXPECT_FALSE(d.apply);
  EXPECT_EQ(d.status.code(), absl::StatusCode::kFailedPrecondition);
  LossScaler scaler({true, 1024.0, 2.0, 0.5, 2000, 1.0});
  d = DecideStep(INFINITY, 1024.0, 0, &scaler);  // fp16 overflow: skipped, not an error
  EXPECT_FALSE(d.apply);
  EXPECT_TRUE(d.status.ok());
  EXPECT_DOUBLE_EQ(scaler.scale(), 512.0);
  d = DecideStep(512.0, 512.0, 0, &scaler);
  EXPECT_TRUE(d.apply);
  EXPECT_DOUBLE_EQ(d.grad_norm, 1.0);
  EXPECT_DOUBLE_EQ(d.multiplier, 1.0 / 512.0);
}

}  // namespace
}  // namespace rp::workers
