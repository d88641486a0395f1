// SGD against torch::optim::SGD (momentum, dampening, Nesterov, weight decay) and Lion against a
// written-out reference in plain tensor ops (torch has no Lion), over many steps on the same
// gradients, through AdamW's dispatch (the engine's path) on every vector width this CPU has
// (scalar, AVX2, AVX-512), the master written in the same pass;
// and a test that fails when a term is dropped (each option really changes the trajectory).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <vector>

#include "workers/optim/adamw.h"
#include "workers/optim/cpu_momentum.h"

namespace rp::workers {
namespace {

spec::ModelConfig Small() {
  spec::ModelConfig c;
  c.vocab = 300;  // the embedding is 300 x 64: slices on the pool's threads
  c.hidden = 64;
  c.intermediate = 96;
  c.num_blocks = 1;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  return c;
}

constexpr int kSteps = 40;

std::vector<at::Tensor> Grads(const HostModelStore& store, int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  std::vector<at::Tensor> g;
  for (int i = 0; i < store.num_params(); ++i) g.push_back(at::randn(store.param(i).fp32.sizes(), gen) * 0.1);
  return g;
}

// Runs `o` for kSteps on the store through AdamW::StepAll; returns the final fp32 weights.
std::vector<at::Tensor> RunOurs(const AdamWOptions& o, HostModelStore& store) {
  AdamW opt(o);
  for (int s = 0; s < kSteps; ++s) {
    store.ZeroGrads();
    auto g = Grads(store, s);
    for (int i = 0; i < store.num_params(); ++i) store.AccumulateGrad(i, g[static_cast<size_t>(i)]);
    opt.StepAll(store, o.lr, 1.0);
  }
  std::vector<at::Tensor> out;
  for (int i = 0; i < store.num_params(); ++i) out.push_back(store.param(i).fp32.clone());
  return out;
}

struct SgdCase {
  double momentum, dampening, weight_decay;
  bool nesterov;
};

AdamWOptions SgdOptions(const SgdCase& c) {
  AdamWOptions o;
  o.algorithm = spec::OptimizerAlgorithm::kSgd;
  o.lr = 0.05;
  o.momentum = c.momentum;
  o.dampening = c.dampening;
  o.weight_decay = c.weight_decay;
  o.nesterov = c.nesterov;
  return o;
}

// The vector widths a test runs: scalar, AVX2 and AVX-512 where this CPU has them.
std::vector<SimdPath> Paths() {
  std::vector<SimdPath> out = {SimdPath::kScalar};
  for (SimdPath p : {SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (SimdPathSupported(p)) out.push_back(p);
  }
  return out;
}

TEST(Sgd, MatchesTorchSgdOverManySteps) {
  for (SimdPath path : Paths()) {
    for (const SgdCase& c : {SgdCase{0, 0, 0, false}, SgdCase{0.9, 0, 0, false}, SgdCase{0.9, 0.1, 0.01, false},
                             SgdCase{0.9, 0, 0.01, true}}) {
      SCOPED_TRACE(::testing::Message() << "momentum " << c.momentum << " dampening " << c.dampening << " wd "
                                        << c.weight_decay << " nesterov " << c.nesterov << " path "
                                        << static_cast<int>(path));
      HostModelStore store(Small(), at::kBFloat16, 3);
      std::vector<at::Tensor> ref;
      for (int i = 0; i < store.num_params(); ++i) ref.push_back(store.param(i).fp32.clone().set_requires_grad(true));
      AdamWOptions o = SgdOptions(c);
      o.threads = 2;
      o.simd = path;
      torch::optim::SGD theirs(ref, torch::optim::SGDOptions(o.lr)
                                        .momentum(c.momentum)
                                        .dampening(c.dampening)
                                        .weight_decay(c.weight_decay)
                                        .nesterov(c.nesterov));
      for (int s = 0; s < kSteps; ++s) {
        auto g = Grads(store, s);
        for (size_t i = 0; i < ref.size(); ++i) ref[i].mutable_grad() = g[i].clone();
        theirs.step();
      }
      const auto ours = RunOurs(o, store);
      for (int i = 0; i < store.num_params(); ++i) {
        const at::Tensor& want = ref[static_cast<size_t>(i)];
        EXPECT_TRUE(at::allclose(ours[static_cast<size_t>(i)], want, 1e-5, 1e-6))
            << store.param(i).name << " " << (ours[static_cast<size_t>(i)] - want).abs().max().item<float>();
        EXPECT_TRUE(at::equal(store.param(i).master, store.param(i).fp32.to(at::kBFloat16))) << store.param(i).name;
      }
    }
  }
}

// Lion written out (the paper's Algorithm 2, as the common PyTorch implementations write it):
// p <- p (1 - lr wd); p <- p - lr sign(beta1 m + (1 - beta1) g); m <- beta2 m + (1 - beta2) g.
TEST(Lion, MatchesAWrittenOutReferenceOverManySteps) {
  for (SimdPath path : Paths()) {
    for (double wd : {0.0, 0.1}) {
      SCOPED_TRACE(::testing::Message() << "weight decay " << wd << " path " << static_cast<int>(path));
      HostModelStore store(Small(), at::kFloat, 3);
      std::vector<at::Tensor> p, m;
      for (int i = 0; i < store.num_params(); ++i) {
        p.push_back(store.param(i).fp32.clone());
        m.push_back(at::zeros_like(p.back()));
      }
      AdamWOptions o;
      o.algorithm = spec::OptimizerAlgorithm::kLion;
      o.lr = 1e-3;
      o.beta1 = 0.9;
      o.beta2 = 0.99;
      o.weight_decay = wd;
      o.threads = 2;
      o.simd = path;
      for (int s = 0; s < kSteps; ++s) {
        auto g = Grads(store, s);
        for (size_t i = 0; i < p.size(); ++i) {
          p[i].mul_(1 - o.lr * wd);
          p[i].sub_(at::sign(m[i] * o.beta1 + g[i] * (1 - o.beta1)) * o.lr);
          m[i] = m[i] * o.beta2 + g[i] * (1 - o.beta2);
        }
      }
      const auto ours = RunOurs(o, store);
      for (int i = 0; i < store.num_params(); ++i) {
        EXPECT_TRUE(at::allclose(ours[static_cast<size_t>(i)], p[static_cast<size_t>(i)], 1e-5, 1e-6))
            << store.param(i).name;
        EXPECT_TRUE(at::equal(store.param(i).master, store.param(i).fp32)) << store.param(i).name;
      }
    }
  }
}

// Every option changes the trajectory (a dropped term would go unnoticed otherwise): plain SGD
// vs momentum vs momentum + dampening vs Nesterov vs weight decay all differ; Lion's update is
// lr times a sign, so after one step from zero momentum every element moved by exactly lr.
TEST(Momentum, EveryTermChangesTheResult) {
  std::vector<std::vector<at::Tensor>> runs;
  for (const SgdCase& c : {SgdCase{0, 0, 0, false}, SgdCase{0.9, 0, 0, false}, SgdCase{0.9, 0.5, 0, false},
                           SgdCase{0.9, 0, 0, true}, SgdCase{0, 0, 0.1, false}}) {
    HostModelStore store(Small(), at::kFloat, 3);
    runs.push_back(RunOurs(SgdOptions(c), store));
  }
  for (size_t a = 0; a < runs.size(); ++a) {
    for (size_t b = a + 1; b < runs.size(); ++b) EXPECT_FALSE(at::equal(runs[a][0], runs[b][0])) << a << " vs " << b;
  }
  std::vector<float> p = {1, 2, 3, 4}, g = {0.5f, -0.25f, 0, 2}, m = {0, 0, 0, 0};
  MomentumBuffers b{p.data(), g.data(), m.data(), nullptr, MasterDtype::kNone};
  LionHyper h;
  h.lr = 0.125f;
  FusedLion(b, 4, h);
  EXPECT_EQ(p, (std::vector<float>{0.875f, 2.125f, 3, 3.875f}));
  EXPECT_EQ(m[0], (1.0f - 0.99f) * 0.5f);  // m <- beta2 m + (1 - beta2) g
  // 37 elements: two 16-wide vectors and a scalar tail agree with the formula written out.
  at::Tensor tp = at::randn({37}), tg = at::randn({37}), tb = at::randn({37});
  at::Tensor want_b = tb * 0.9 + tg * 0.8, want_p = tp - (tg + want_b * 0.9) * 0.1;  // nesterov, dampening 0.2
  MomentumBuffers sb{tp.data_ptr<float>(), tg.data_ptr<float>(), tb.data_ptr<float>(), nullptr, MasterDtype::kNone};
  SgdHyper sh;
  sh.lr = 0.1f;
  sh.momentum = 0.9f;
  sh.dampening = 0.2f;
  sh.nesterov = true;
  FusedSgd(sb, 37, sh);
  EXPECT_TRUE(at::allclose(tb, want_b, 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(tp, want_p, 1e-6, 1e-6));
}

}  // namespace
}  // namespace rp::workers
