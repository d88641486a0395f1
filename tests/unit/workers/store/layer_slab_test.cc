// The host store's layer slabs (host_model_store.h): a layer's fp32 copies, gradients and the
// optimizer state reserved beside them are one allocation, and keeping the state there changes
// no arithmetic (compared bit for bit with state the optimizer allocates on its own).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/support/tiny_models.h"
#include "workers/optim/adamw.h"
#include "workers/store/host_model_store.h"

namespace rp::workers {
namespace {

spec::ModelConfig Tiny() { return rp::testing::TinyLlama(); }

const void* StorageOf(const at::Tensor& t) { return t.storage().data_ptr().get(); }

struct Case {
  std::string name;
  AdamWOptions o;
};
std::vector<Case> EveryOptimizer() {
  std::vector<Case> cases;
  AdamWOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  cases.push_back({"adamw", o});
  o.amsgrad = true;
  cases.push_back({"adamw amsgrad", o});
  o.amsgrad = false;
  o.bf16_moments = true;
  o.rounding_seed = 3;
  cases.push_back({"adamw bf16 moments", o});
  o.bf16_moments = false;
  o.algorithm = spec::OptimizerAlgorithm::kSgd;
  o.momentum = 0.9;
  o.dampening = 0.1;
  o.nesterov = false;
  cases.push_back({"sgd momentum", o});
  o.algorithm = spec::OptimizerAlgorithm::kLion;
  o.lr = 1e-3;
  cases.push_back({"lion", o});
  o.algorithm = spec::OptimizerAlgorithm::kAdafactor;
  cases.push_back({"adafactor", o});
  return cases;
}

void FillGrads(HostModelStore& store, int step) {
  store.ZeroGrads();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  for (int i = 0; i < store.num_params(); ++i) {
    if (store.param(i).trainable) store.AccumulateGrad(i, at::randn(store.param(i).shape, gen, at::kFloat) * 0.1);
  }
}

TEST(LayerSlab, EveryLayerTrainsFromOneAllocationThatAlsoHoldsItsOptimizerState) {
  AdamWOptions o;
  const StateReserve reserve = StateBytesPerElement(o);
  ASSERT_EQ(reserve.bytes_per_element, 8);
  const spec::ModelConfig cfg = Tiny();
  HostModelStore store(cfg, at::kBFloat16, 5, 0.02, FrozenInit::kRandom, reserve);
  EXPECT_EQ(store.num_slabs(), cfg.num_layers());
  int64_t needed = 0;
  for (int i = 0; i < store.num_params(); ++i) needed += store.param(i).fp32.numel() * (4 + 4 + 8);
  EXPECT_GE(store.SlabBytes(), needed);
  EXPECT_LE(store.SlabBytes(), needed + int64_t{3} * 64 * store.num_params());  // alignment only
  AdamW adamw(o);
  FillGrads(store, 0);
  ASSERT_TRUE(adamw.Step(store, o.lr).ok());
  const AdamWState s = adamw.state();
  for (int l = 0; l < cfg.num_layers(); ++l) {
    const void* slab = nullptr;
    for (int i : store.layer_params(l)) {
      const HostParam& p = store.param(i);
      if (slab == nullptr) slab = StorageOf(p.fp32);
      for (const at::Tensor* t : {&p.fp32, &p.grad, &s.m[static_cast<size_t>(i)], &s.v[static_cast<size_t>(i)]}) {
        EXPECT_EQ(StorageOf(*t), slab) << "layer " << l << " " << p.name;
      }
      EXPECT_NE(StorageOf(p.master), slab) << p.name << ": masters stay apart (pinned on CUDA)";
    }
  }
  // The state is counted once, by the optimizer; the store's bytes are its own tensors.
  EXPECT_EQ(adamw.StateBytes(), needed / 16 * 8);
}

// Every optimizer, three steps, then (AMSGrad aside) a resume from a checkpoint-like copy of the state (fp32,
// separate tensors) into a fresh store and optimizer: the slab-resident state gives the same bits
// as state allocated on its own.
TEST(LayerSlab, StateInTheSlabStepsAndResumesBitIdenticallyToStateOnItsOwn) {
  for (const Case& c : EveryOptimizer()) {
    SCOPED_TRACE(c.name);
    HostModelStore slab(Tiny(), at::kBFloat16, 5, 0.02, FrozenInit::kRandom, StateBytesPerElement(c.o));
    HostModelStore apart(Tiny(), at::kBFloat16, 5, 0.02, FrozenInit::kRandom, StateReserve{0});
    AdamW a(c.o), b(c.o);
    for (int step = 0; step < 3; ++step) {
      FillGrads(slab, step);
      FillGrads(apart, step);
      ASSERT_TRUE(a.Step(slab, c.o.lr).ok());
      ASSERT_TRUE(b.Step(apart, c.o.lr).ok());
    }
    for (int i = 0; i < apart.num_params(); ++i) {
      EXPECT_TRUE(at::equal(slab.param(i).fp32, apart.param(i).fp32)) << slab.param(i).name;
    }
    // AMSGrad's running maximum is not in checkpoints (and AMSGrad not in job specs): no resume.
    if (c.o.amsgrad) continue;
    // Resume: the state as a checkpoint reads it back (fp32 copies), into a fresh slab store.
    HostModelStore resumed(Tiny(), at::kBFloat16, 77, 0.02, FrozenInit::kRandom, StateBytesPerElement(c.o));
    AdamWState saved = a.state();
    for (auto* side : {&saved.m, &saved.v}) {
      for (at::Tensor& t : *side) {
        if (t.defined()) t = t.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
      }
    }
    for (int i = 0; i < slab.num_params(); ++i)
      ASSERT_TRUE(resumed.SetValue(slab.param(i).name, slab.param(i).fp32).ok());
    AdamW r(c.o);
    r.set_state(saved);
    for (int step = 3; step < 5; ++step) {
      FillGrads(resumed, step);
      FillGrads(apart, step);
      ASSERT_TRUE(r.Step(resumed, c.o.lr).ok());
      ASSERT_TRUE(b.Step(apart, c.o.lr).ok());
    }
    const bool in_slab = StateBytesPerElement(c.o).bytes_per_element > 0;
    const AdamWState ours = r.state(), reference = b.state();
    for (int i = 0; i < apart.num_params(); ++i) {
      const HostParam& p = resumed.param(i);
      EXPECT_TRUE(at::equal(p.fp32, apart.param(i).fp32)) << p.name;
      EXPECT_TRUE(at::equal(p.master, apart.param(i).master)) << p.name;
      const size_t k = static_cast<size_t>(i);
      for (auto [mine, theirs] : {std::pair{&ours.m[k], &reference.m[k]}, std::pair{&ours.v[k], &reference.v[k]}}) {
        ASSERT_EQ(mine->defined(), theirs->defined()) << p.name;
        if (!mine->defined()) continue;  // SGD/Lion: no v; Adafactor on a vector: no m
        EXPECT_TRUE(at::equal(*mine, *theirs)) << p.name;
        EXPECT_EQ(StorageOf(*mine) == StorageOf(p.fp32), in_slab) << p.name;
      }
    }
  }
}

// The reserve serves the first optimizer that steps; a second one on the same store allocates
// its own state instead of sharing (and corrupting) the first one's.
TEST(LayerSlab, ASecondOptimizerOnTheSameStoreKeepsItsStateApart) {
  AdamWOptions o;
  HostModelStore store(Tiny(), at::kFloat, 5, 0.02, FrozenInit::kRandom, StateBytesPerElement(o));
  AdamW first(o), second(o);
  FillGrads(store, 0);
  ASSERT_TRUE(first.Step(store, o.lr).ok());
  std::vector<at::Tensor> before;
  for (const at::Tensor& m : first.state().m) before.push_back(m.clone());
  FillGrads(store, 1);
  ASSERT_TRUE(second.Step(store, o.lr).ok());
  const AdamWState a = first.state(), b = second.state();
  for (int i = 0; i < store.num_params(); ++i) {
    const size_t k = static_cast<size_t>(i);
    EXPECT_TRUE(at::equal(a.m[k], before[k])) << store.param(i).name;
    EXPECT_NE(StorageOf(b.m[k]), StorageOf(store.param(i).fp32)) << store.param(i).name;
  }
}

// A LoRA store has slabs only for the layers that train something (the adapters); its frozen
// base has no fp32 copy, gradient or reserve.
TEST(LayerSlab, ALoraBaseReservesNothing) {
  spec::ModelConfig cfg = Tiny();
  cfg.lora.rank = 2;
  cfg.lora.alpha = 4;
  HostModelStore store(cfg, at::kBFloat16, 5, 0.02, FrozenInit::kRandom, StateReserve{8});
  int64_t adapters = 0;
  for (int i = 0; i < store.num_params(); ++i) {
    const HostParam& p = store.param(i);
    EXPECT_EQ(p.state_reserve.defined(), p.trainable) << p.name;
    if (p.trainable) adapters += p.fp32.numel();
  }
  EXPECT_GE(store.SlabBytes(), adapters * 16);
  EXPECT_LT(store.SlabBytes(), adapters * 16 + int64_t{3} * 64 * store.num_params());
}

}  // namespace
}  // namespace rp::workers
