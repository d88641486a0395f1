#include "workers/optim/cpu_adamw.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace rp::workers {
namespace {

// The fused kernel against torch::optim::AdamW over 3 steps: every size class (empty, one
// element, vector tails, multi-threaded slices), every flag combination, every SIMD path this
// CPU has, and the master copy in fp32 / bf16 / fp16.
TEST(CpuAdamW, MatchesTorchAdamWEverywhere) {
  std::vector<SimdPath> paths = {SimdPath::kScalar};
  if (SimdPathSupported(SimdPath::kAvx2)) paths.push_back(SimdPath::kAvx2);
  if (SimdPathSupported(SimdPath::kAvx512)) paths.push_back(SimdPath::kAvx512);
  GTEST_LOG_(INFO) << "SIMD paths tested: " << paths.size() << " (best: " << BestSimdPathName() << ")";
  int cases = 0;
  OptimizerThreads pool(2);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{33},
                    int64_t{1000}, int64_t{70001}}) {
    for (double wd : {0.0, 0.05}) {
      for (bool amsgrad : {false, true}) {
        for (bool maximize : {false, true}) {
          for (SimdPath path : paths) {
            for (at::ScalarType mdt : {at::kFloat, at::kBFloat16, at::kHalf}) {
              SCOPED_TRACE(::testing::Message()
                           << "n=" << n << " wd=" << wd << " amsgrad=" << amsgrad << " maximize=" << maximize
                           << " path=" << static_cast<int>(path) << " master=" << c10::toString(mdt));
              auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(n) + 17);
              at::Tensor p0 = at::randn({n}, gen, at::kFloat);
              at::Tensor ours = p0.clone();
              at::Tensor ref = p0.clone().set_requires_grad(true);
              at::Tensor m = at::zeros({n}), v = at::zeros({n}), vmax = at::zeros({n});
              at::Tensor master = at::empty({n}, at::TensorOptions().dtype(mdt));
              torch::optim::AdamW opt({ref}, torch::optim::AdamWOptions(2e-3).weight_decay(wd).amsgrad(amsgrad));
              for (int step = 1; step <= 3; ++step) {
                at::Tensor g = at::randn({n}, gen, at::kFloat) * 0.5;
                // maximize = descend on -grad; the C++ torch optimizer has no flag, so negate.
                ref.mutable_grad() = maximize ? -g : g.clone();
                opt.step();
                AdamWBuffers b{ours.data_ptr<float>(),
                               g.data_ptr<float>(),
                               m.data_ptr<float>(),
                               v.data_ptr<float>(),
                               vmax.data_ptr<float>(),
                               master.data_ptr(),
                               mdt == at::kFloat      ? MasterDtype::kFloat32
                               : mdt == at::kBFloat16 ? MasterDtype::kBFloat16
                                                      : MasterDtype::kFloat16};
                AdamWHyper h;
                h.lr = 2e-3f;
                h.weight_decay = static_cast<float>(wd);
                h.step = step;
                h.amsgrad = amsgrad;
                h.maximize = maximize;
                FusedAdamW(b, n, h, path, &pool);
              }
              if (n > 0) {
                const double rel = (ours - ref.detach()).abs().max().item<double>() /
                                   std::max(1e-30, ref.detach().abs().max().item<double>());
                EXPECT_LT(rel, 1e-6);
                EXPECT_TRUE(at::equal(master, ours.to(mdt)));  // exactly the rounded fp32 value
              }
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_GE(cases, 10 * 2 * 2 * 2 * 3);
}

// A pass long enough for the streaming bf16 master stores and split over the optimizer's own
// threads (3 here: uneven slices, helpers that get no slice when it is short): the same values
// as torch::optim::AdamW, and the master exactly the rounded parameter, at every pool size.
TEST(CpuAdamW, LongPassesOnThePoolMatchTorchWithTheStreamedMaster) {
  const int64_t n = (int64_t{4} << 20) + 37;
  for (int threads : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "threads=" << threads);
    OptimizerThreads pool(threads);
    EXPECT_EQ(pool.size(), threads);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    at::Tensor p0 = at::randn({n}, gen, at::kFloat);
    at::Tensor ours = p0.clone(), ref = p0.clone().set_requires_grad(true);
    at::Tensor m = at::zeros({n}), v = at::zeros({n});
    at::Tensor master = at::empty({n}, at::TensorOptions().dtype(at::kBFloat16));
    torch::optim::AdamW opt({ref}, torch::optim::AdamWOptions(2e-3).weight_decay(0.05));
    for (int step = 1; step <= 2; ++step) {
      at::Tensor g = at::randn({n}, gen, at::kFloat);
      ref.mutable_grad() = g.clone();
      opt.step();
      AdamWBuffers b{ours.data_ptr<float>(), g.data_ptr<float>(),   m.data_ptr<float>(), v.data_ptr<float>(), nullptr,
                     master.data_ptr(),      MasterDtype::kBFloat16};
      AdamWHyper h;
      h.lr = 2e-3f;
      h.weight_decay = 0.05f;
      h.step = step;
      FusedAdamW(b, n, h, SimdPath::kAuto, &pool);
    }
    const double rel = (ours - ref.detach()).abs().max().item<double>() / ref.detach().abs().max().item<double>();
    EXPECT_LT(rel, 1e-6);
    EXPECT_TRUE(at::equal(master, ours.to(at::kBFloat16)));
  }
}

// AdamW with bf16 moments, written out independently: fp32 math in the kernel's order, moments
// read from bf16, stored with the documented stochastic rounding.
struct Bf16MomentReference {
  std::vector<float> p;
  std::vector<uint16_t> m, v, master;
  void Step(const std::vector<float>& g, const AdamWHyper& h, uint64_t seed) {
    const double bc1 = 1 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
    const double bc2 = 1 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
    const float decay = 1.0f - h.lr * h.weight_decay, one_m_b1 = 1.0f - h.beta1, one_m_b2 = 1.0f - h.beta2;
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2)), step_size = static_cast<float>(h.lr / bc1);
    auto to_float = [](uint16_t b) {
      const uint32_t u = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    for (size_t i = 0; i < p.size(); ++i) {
      const float gi = g[i] * h.grad_scale;
      float pi = p[i] * decay;
      float mi = to_float(m[i]);
      mi = mi + one_m_b1 * (gi - mi);
      const float vi = h.beta2 * to_float(v[i]) + one_m_b2 * gi * gi;
      pi = pi - step_size * (mi / (std::sqrt(vi) * inv_sqrt_bc2 + h.eps));
      m[i] = StochasticRoundBf16(mi, StochasticRoundingBits(seed, h.step, static_cast<int64_t>(i), 0));
      v[i] = StochasticRoundBf16(vi, StochasticRoundingBits(seed, h.step, static_cast<int64_t>(i), 1));
      p[i] = pi;
      master[i] = c10::BFloat16(pi).x;
    }
  }
};

// The scalar path is the written-out reference bit for bit; each vector path this CPU has (the
// AVX-512 one and the AVX2 one that hosts without AVX-512 run) agrees with it to a hair in the
// parameters and to one bf16 ulp in the moments (FMA).
TEST(CpuAdamWBf16Moments, ScalarPathEqualsTheWrittenOutReferenceBitForBitAndTheVectorPathsAgreeToAnUlp) {
  OptimizerThreads pool(2);
  std::vector<SimdPath> vector_paths;
  for (SimdPath path : {SimdPath::kAvx512, SimdPath::kAvx2}) {
    if (SimdPathSupported(path)) vector_paths.push_back(path);
  }
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{1000}, int64_t{70001}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(n));
    at::Tensor p0 = at::randn({n}, gen, at::kFloat);
    Bf16MomentReference ref{std::vector<float>(p0.data_ptr<float>(), p0.data_ptr<float>() + n),
                            std::vector<uint16_t>(static_cast<size_t>(n), 0),
                            std::vector<uint16_t>(static_cast<size_t>(n), 0),
                            std::vector<uint16_t>(static_cast<size_t>(n), 0)};
    struct Run {
      SimdPath path;
      std::vector<float> p;
      std::vector<uint16_t> m, v, master;
    };
    std::vector<Run> runs;
    const std::vector<uint16_t> zeros(static_cast<size_t>(n), 0);
    runs.push_back({SimdPath::kScalar, ref.p, zeros, zeros, zeros});
    for (SimdPath path : vector_paths) runs.push_back({path, ref.p, zeros, zeros, zeros});
    for (int step = 1; step <= 5; ++step) {
      at::Tensor g = at::randn({n}, gen, at::kFloat);
      std::vector<float> gv(g.data_ptr<float>(), g.data_ptr<float>() + n);
      AdamWHyper h;
      h.lr = 2e-3f;
      h.weight_decay = 0.05f;
      h.step = step;
      h.grad_scale = 0.5f;
      ref.Step(gv, h, /*seed=*/99);
      for (Run& r : runs) {
        FusedAdamWBf16Moments({r.p.data(), gv.data(), r.m.data(), r.v.data(), r.master.data(), MasterDtype::kBFloat16},
                              n, h, 99, r.path, &pool);
      }
    }
    EXPECT_EQ(runs[0].p, ref.p);
    EXPECT_EQ(runs[0].m, ref.m);
    EXPECT_EQ(runs[0].v, ref.v);
    EXPECT_EQ(runs[0].master, ref.master);
    for (size_t k = 1; k < runs.size(); ++k) {
      const Run& r = runs[k];
      SCOPED_TRACE(r.path == SimdPath::kAvx512 ? "avx512" : "avx2");
      double worst = 0;
      int far_moments = 0;
      for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(r.p[i]) - ref.p[i]));
        far_moments += std::abs(static_cast<int>(r.m[i]) - static_cast<int>(ref.m[i])) > 1;
        far_moments += std::abs(static_cast<int>(r.v[i]) - static_cast<int>(ref.v[i])) > 1;
      }
      EXPECT_LT(worst, 1e-5);  // FMA on the vector paths; every value within a hair of the reference
      EXPECT_EQ(far_moments, 0);
    }
  }
}

TEST(CpuAdamWBf16Moments, StochasticRoundingIsUnbiasedWhereNearestRoundingStalls) {
  // v += (1 - beta2) * (g^2 - v) at a fixed point v = 1: nearest rounding keeps a bf16 value
  // still when the increment is below half an ulp; stochastic rounding moves it on average.
  const float x = 1.0f + 1.0f / 512;  // a quarter ulp above 1 (bf16 ulp at 1 is 2^-7)
  double sum = 0;
  const int trials = 20000;
  for (int i = 0; i < trials; ++i) {
    const uint16_t r = StochasticRoundBf16(x, StochasticRoundingBits(7, 1, i, 1));
    uint32_t u = static_cast<uint32_t>(r) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    sum += f;
  }
  EXPECT_NEAR(sum / trials, x, 1e-4);                    // unbiased
  EXPECT_EQ(c10::BFloat16(x).x, c10::BFloat16(1.0f).x);  // nearest rounding loses it
  uint32_t nan_bits = 0x7fc00001u;
  float nan;
  std::memcpy(&nan, &nan_bits, 4);
  EXPECT_EQ(StochasticRoundBf16(nan, 0xffffffffu) & 0x7fc0, 0x7fc0);  // a NaN stays a NaN
}

TEST(OptimizerThreads, EveryElementIsVisitedOnceInAlignedSlices) {
  OptimizerThreads pool(3);
  for (int64_t n : {int64_t{1}, int64_t{100}, int64_t{1000003}}) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    std::atomic<int> slices{0};
    pool.ParallelFor(n, 64, 8, [&](int64_t begin, int64_t end) {
      EXPECT_EQ(begin % 64, 0);
      ++slices;
      for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << "n=" << n << " i=" << i;
    EXPECT_LE(slices.load(), 3);
  }
}

}  // namespace
}  // namespace rp::workers
