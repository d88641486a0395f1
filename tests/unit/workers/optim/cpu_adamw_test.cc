#include "workers/optim/cpu_adamw.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <atomic>
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
