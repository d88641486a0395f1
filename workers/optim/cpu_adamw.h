// cpu_adamw.h — the fused CPU AdamW kernel: one pass over (param, grad, exp_avg, exp_avg_sq
// [, max_exp_avg_sq]) that also writes the low-precision master copy (P_cp fused into the step).
// Vectorised with AVX-512 or AVX2+FMA (chosen at run time from the CPU's features), with a
// scalar fallback; multi-threaded over balanced slices of the tensor on the optimizer's own
// threads (optimizer_threads.h).
//
// Contract: pure function over raw buffers the caller owns; the buffers must not overlap and
// must hold `n` elements. Thread-safe for distinct buffers. Semantics of torch.optim.AdamW
// (decoupled weight decay, bias correction, eps after the bias-corrected square root,
// optional amsgrad and maximize).
#pragma once

#include <cstdint>
#include <string>

#include "workers/optim/fused_pass.h"
#include "workers/optim/optimizer_threads.h"

namespace rp::workers {

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;         // 1-based, for the bias corrections
  float grad_scale = 1.0f;  // multiplies the gradient first (loss-scale removal x clipping)
  bool amsgrad = false;
  bool maximize = false;
};

struct AdamWBuffers {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;  // amsgrad only
  void* master = nullptr;           // written when master_dtype != kNone
  MasterDtype master_dtype = MasterDtype::kNone;
};

enum class SimdPath { kAuto, kScalar, kAvx2, kAvx512 };

// Updates n elements, on the caller and `pool`'s threads (null: the caller alone; never ATen's
// intra-op pool, which the device workers' stage math uses). Large passes write a bf16 master
// with streaming stores.
void FusedAdamW(const AdamWBuffers& b, int64_t n, const AdamWHyper& h, SimdPath path = SimdPath::kAuto,
                OptimizerThreads* pool = nullptr);

// AdamW with bf16 moments: the same update, computed in fp32, with exp_avg and exp_avg_sq
// stored as bf16 (4 bytes less optimizer state and traffic per parameter: a pass reads p, g, m,
// v and writes p, m, v and the master in 22 B instead of 30). A moment is stored with
// stochastic rounding — bf16 round-to-nearest would lose every increment of v smaller than half
// an ulp (1 - beta2 = 1e-3 of v is far below bf16's 2^-8), so v would never decay or grow — and
// the rounding bits are a hash of (seed, step, element, moment), so a step is deterministic
// and a resumed run is bit-identical. No amsgrad (a broken invariant if asked: the job spec
// refuses it first).
struct AdamWBf16MomentBuffers {
  float* param = nullptr;
  const float* grad = nullptr;
  uint16_t* exp_avg = nullptr;     // bf16 bits
  uint16_t* exp_avg_sq = nullptr;  // bf16 bits
  void* master = nullptr;
  MasterDtype master_dtype = MasterDtype::kNone;
};
void FusedAdamWBf16Moments(const AdamWBf16MomentBuffers& b, int64_t n, const AdamWHyper& h, uint64_t seed,
                           SimdPath path = SimdPath::kAuto, OptimizerThreads* pool = nullptr);

// The rounding bits of element `index` (its low 32 bits) for moment `stream` (0: exp_avg,
// 1: exp_avg_sq) at `step`, and the stochastic rounding they drive: x's bit pattern plus the low
// 16 bits, truncated to bf16 (a NaN stays a quiet NaN of the same sign). Public so a reference
// can reproduce the kernel exactly.
uint32_t StochasticRoundingBits(uint64_t seed, int64_t step, int64_t index, int stream);
uint16_t StochasticRoundBf16(float x, uint32_t bits);

// The path kAuto picks on this CPU ("avx512", "avx2" or "scalar").
std::string BestSimdPathName();
bool SimdPathSupported(SimdPath p);
// The path a kernel runs for `path`: kAuto the widest this CPU has; an explicit one when the CPU
// has it, else the next narrower it has (kScalar always).
SimdPath ResolveSimdPath(SimdPath path);

}  // namespace rp::workers
