// Adafactor (cpu_adafactor.h, and through AdamWOptions::algorithm) against torch.optim.Adafactor
// itself: adafactor_reference.py runs torch's optimizer from the venv for 40 steps on seven shapes
// (matrices, a vector, a 3-d batch of matrices, one-row and one-column matrices, a tall one that
// the optimizer's threads slice, one with more rows than a column flush and a 16-wide tail) and
// the kernel (scalar and AVX-512) repeats it from the same start with the same
// gradients.
#include "workers/optim/cpu_adafactor.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"
#include "workers/io/safetensors_reader.h"
#include "workers/optim/adamw.h"

namespace rp::workers {
namespace {

using io::SafetensorsFile;

constexpr int kShapes = 7;
constexpr int kSteps = 40;

struct Reference {
  std::unique_ptr<SafetensorsFile> file;
  std::string error;
  at::Tensor Get(const std::string& name) const { return *file->Read(name, at::kFloat); }
  bool Has(const std::string& name) const { return file->Find(name) != nullptr; }
};

Reference MakeReference(const std::string& dir, const std::string& which) {
  Reference r;
  const std::string out = dir + "/" + which + ".safetensors";
  std::string log;
  const std::string command =
      absl::StrCat(RP_VENV_PYTHON, " ", RP_TEST_DIR, "/adafactor_reference.py ", out, " ", which);
  if (rp::testing::RunCommand(command, &log) != 0) {
    r.error = log;
    return r;
  }
  auto f = SafetensorsFile::Open(out);
  if (!f.ok()) {
    r.error = std::string(f.status().message());
    return r;
  }
  r.file = std::move(*f);
  return r;
}

AdafactorShape ShapeOf(const at::Tensor& p) {
  AdafactorShape s;
  if (p.dim() >= 2) {
    s.rows = p.size(-2);
    s.cols = p.size(-1);
    for (int64_t k = 0; k + 2 < p.dim(); ++k) s.batch *= p.size(k);
  } else {
    s.cols = p.numel();
  }
  return s;
}

// Runs the kernel over the reference's gradients; returns, per shape, the parameter and the state.
struct Ours {
  std::vector<at::Tensor> param, row_var, col_var, variance, master;
};
Ours RunKernel(const Reference& ref, const AdafactorHyper& base, OptimizerThreads* pool, SimdPath path,
               bool drop_rms_scaling = false) {
  Ours o;
  for (int k = 0; k < kShapes; ++k) {
    at::Tensor p = ref.Get("p0." + std::to_string(k)).contiguous();
    const AdafactorShape s = ShapeOf(p);
    at::Tensor row, col, var;
    at::Tensor master = at::empty(p.sizes(), at::kBFloat16);
    AdafactorBuffers b;
    b.param = p.data_ptr<float>();
    if (s.rows > 0) {
      row = at::zeros(*AdafactorStateShape('m', p.sizes().vec()));
      col = at::zeros(*AdafactorStateShape('v', p.sizes().vec()));
      b.row_var = row.data_ptr<float>();
      b.col_var = col.data_ptr<float>();
    } else {
      var = at::zeros(*AdafactorStateShape('v', p.sizes().vec()));
      b.variance = var.data_ptr<float>();
    }
    b.master = master.data_ptr();
    b.master_dtype = MasterDtype::kBFloat16;
    for (int step = 1; step <= kSteps; ++step) {
      at::Tensor g = ref.Get("g." + std::to_string(k) + "." + std::to_string(step - 1)).contiguous();
      // The kernel takes the gradient times a multiplier (loss-scale removal x clipping): feed it a
      // gradient scaled by 4 and the multiplier 1/4, which must come to the same.
      g.mul_(4.0f);
      b.grad = g.data_ptr<float>();
      AdafactorHyper h = base;
      h.step = step;
      h.grad_scale = 0.25f;
      if (drop_rms_scaling) h.eps2 = 1.0;  // the relative step's parameter-RMS term made constant
      FusedAdafactor(b, s, h, path, pool);
    }
    o.param.push_back(p);
    o.row_var.push_back(row);
    o.col_var.push_back(col);
    o.variance.push_back(var);
    o.master.push_back(master);
  }
  return o;
}

// Within float32 summation-order noise of torch's own reductions (ours sum in double).
void ExpectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double err = (got - want).abs().max().item<double>();
  const double tol = 2e-6 + 1e-5 * want.abs().max().item<double>();
  EXPECT_LE(err, tol) << what << ": max error " << err;
}

class AdafactorVsTorch : public ::testing::Test {
 protected:
  std::string Dir() {
    return rp::testing::FreshTempDir("adafactor", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
};

AdafactorHyper HyperOf(const std::string& which) {
  AdafactorHyper h;
  if (which == "every_term") {
    h.lr = 3e-2;
    h.beta2_decay = -0.6;
    h.eps1 = 1e-6;
    h.eps2 = 1e-2;
    h.d = 2.0;
    h.weight_decay = 0.1;
    h.maximize = true;
  }
  return h;
}

TEST_F(AdafactorVsTorch, EqualsTorchOverFortyStepsWithDefaultsAndWithEveryTerm) {
  OptimizerThreads pool(3);
  for (const std::string which : {"defaults", "every_term"}) {
    const Reference ref = MakeReference(Dir(), which);
    ASSERT_TRUE(ref.error.empty()) << "the oracle adafactor_reference.py (torch.optim.Adafactor) failed: " << ref.error;
    for (int variant = 0; variant < 6; ++variant) {
      OptimizerThreads* p = variant % 2 ? &pool : nullptr;
      const SimdPath path = variant < 2 ? SimdPath::kScalar : variant < 4 ? SimdPath::kAvx2 : SimdPath::kAvx512;
      if (path != SimdPath::kScalar && !SimdPathSupported(path)) continue;
      const Ours ours = RunKernel(ref, HyperOf(which), p, path);
      for (int k = 0; k < kShapes; ++k) {
        const std::string K = std::to_string(k);
        const std::string what = which + (p ? " threaded" : "") +
                                 (path == SimdPath::kScalar ? " scalar"
                                  : path == SimdPath::kAvx2 ? " avx2"
                                                            : " avx512") +
                                 " shape " + K;
        ExpectClose(ours.param[static_cast<size_t>(k)], ref.Get("p." + K), what + " param");
        EXPECT_TRUE(
            at::equal(ours.master[static_cast<size_t>(k)], ours.param[static_cast<size_t>(k)].to(at::kBFloat16)))
            << what << ": the master is the parameter rounded";
        if (ref.Has("row_var." + K)) {
          ExpectClose(ours.row_var[static_cast<size_t>(k)], ref.Get("row_var." + K), what + " row_var");
          ExpectClose(ours.col_var[static_cast<size_t>(k)], ref.Get("col_var." + K), what + " col_var");
        } else {
          ExpectClose(ours.variance[static_cast<size_t>(k)], ref.Get("variance." + K), what + " variance");
        }
      }
    }
  }
}

// The same thread count gives the same bits (partial sums are combined in slice order), so a
// resumed job continues bit-identically; and the test above fails when a term is dropped.
TEST_F(AdafactorVsTorch, DeterministicPerThreadCountAndEveryTermMatters) {
  const Reference ref = MakeReference(Dir(), "defaults");
  ASSERT_TRUE(ref.error.empty()) << "the oracle adafactor_reference.py (torch.optim.Adafactor) failed: " << ref.error;
  OptimizerThreads pool(3);
  const Ours a = RunKernel(ref, HyperOf("defaults"), &pool, SimdPath::kAuto);
  const Ours b = RunKernel(ref, HyperOf("defaults"), &pool, SimdPath::kAuto);
  for (int k = 0; k < kShapes; ++k)
    EXPECT_TRUE(at::equal(a.param[static_cast<size_t>(k)], b.param[static_cast<size_t>(k)]));
  // Without the parameter-RMS scaling of the step (eps2 raised above the small parameters' RMS
  // of 0.02), those end far from torch's.
  const Ours wrong = RunKernel(ref, HyperOf("defaults"), &pool, SimdPath::kAuto, /*drop_rms_scaling=*/true);
  for (int k : {1, 3}) {
    const double err =
        (wrong.param[static_cast<size_t>(k)] - ref.Get("p." + std::to_string(k))).abs().max().item<double>();
    EXPECT_GT(err, 1e-2) << "shape " << k;
  }
}

}  // namespace
}  // namespace rp::workers
