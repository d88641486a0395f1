// cpu_adafactor.h — the CPU kernel of Adafactor (Shazeer & Stern 2018) as torch.optim.Adafactor
// computes it: second moments factored over the last two dimensions (a row and a column
// vector instead of a full-size buffer: the host-memory saving), no first moment, a relative
// step size rho_t = min(lr, 1/sqrt(t)) scaled by the parameter's RMS (at least eps2), updates
// clipped to RMS d, decoupled weight decay lr * weight_decay, beta2_t = 1 - t^beta2_decay.
//
// Three passes over the parameter, each sliced by rows on the optimizer's threads: (1) the
// parameter's sum of squares and the gradient's row and column sums of squares; (2) the update's
// sum of squares; (3) the step itself, which also writes the master copy. Partial sums are
// combined in slice order, so a step is deterministic for a given thread count and SIMD path (a
// resumed job continues bit-identically). The update's inverse square root is taken apart per
// row and per column (1/sqrt(r) * 1/sqrt(c/mean), within an ulp or two of torch's rsqrt of the
// product), so the element passes are multiplies only. Vectorised 16 columns at a time with
// AVX-512, 8 with AVX2 (SimdPath::kAuto: the widest the CPU has), scalar otherwise.
//
// Contract: pure function over raw buffers the caller owns (not overlapping); thread-safe for
// distinct buffers. Factored (`rows` > 0): `row_var` holds batch*rows floats, `col_var`
// batch*cols, the parameter batch*rows*cols; unfactored (1-d and 0-d parameters): `variance`
// holds as many floats as the parameter. The state starts at zero.
#pragma once

#include <cstdint>

#include "workers/optim/cpu_adamw.h"
#include "workers/optim/fused_pass.h"
#include "workers/optim/optimizer_threads.h"

namespace rp::workers {

struct AdafactorBuffers {
  float* param = nullptr;
  const float* grad = nullptr;
  float* row_var = nullptr;   // factored: [batch, rows]
  float* col_var = nullptr;   // factored: [batch, cols]
  float* variance = nullptr;  // unfactored: [n]
  void* master = nullptr;     // written when master_dtype != kNone
  MasterDtype master_dtype = MasterDtype::kNone;
};

// The parameter as [batch, rows, cols] (its last two dimensions factored, the leading ones a
// batch, as torch does), or unfactored: rows = 0 and `cols` elements.
struct AdafactorShape {
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t numel() const { return rows > 0 ? batch * rows * cols : cols; }
};

struct AdafactorHyper {
  double lr = 1e-2;
  double beta2_decay = -0.8;
  double eps1 = 0;  // <= 0: float32's machine epsilon (torch's default for fp32 parameters)
  double eps2 = 1e-3;
  double d = 1.0;  // update clipping threshold (RMS)
  double weight_decay = 0;
  bool maximize = false;
  int64_t step = 1;         // 1-based, after this step's increment
  float grad_scale = 1.0f;  // multiplies the gradient first (loss-scale removal x clipping)
};

// `path`: AVX-512 for the factored passes where the CPU has it (kAuto), or the scalar loops
// (kScalar; kAvx2 means scalar here). Vectors (unfactored) always take the scalar loops.
void FusedAdafactor(const AdafactorBuffers& b, const AdafactorShape& shape, const AdafactorHyper& h,
                    SimdPath path = SimdPath::kAuto, OptimizerThreads* pool = nullptr);

}  // namespace rp::workers
