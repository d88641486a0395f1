// optimizer_spec.h — the update rule a job trains with, as its hyperparameters: the algorithm
// (torch.optim's AdamW, SGD, Adafactor, or Lion), its coefficients, gradient clipping, and the
// learning-rate schedule. The daemon's job specs, checkpoints and the host-memory estimate read
// it; the data plane's optimizer (workers/optim/adamw.h AdamWOptions) extends it with how to run.
//
// Contract: plain value types, no I/O, no LibTorch; LrSchedule::At is a pure function.
#pragma once

#include <cstdint>

namespace rp::spec {

enum class OptimizerAlgorithm {
  kAdamW,  // torch.optim.AdamW
  kSgd,    // torch.optim.SGD: momentum, dampening, nesterov, L2 weight decay
  kLion,   // Chen et al. 2023: sign of beta1-interpolated momentum, decoupled weight decay
  // torch.optim.Adafactor: factored second moments (a row and a column vector per matrix, a
  // full buffer for vectors), relative step size, RMS-clipped updates.
  kAdafactor,
};

// The update rule's name as checkpoints and the API spell it: "adamw", "sgd", "lion", "adafactor".
const char* OptimizerName(OptimizerAlgorithm a);

struct OptimizerSpec {
  OptimizerAlgorithm algorithm = OptimizerAlgorithm::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;  // Lion uses beta1 and beta2 too
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double max_grad_norm = 0;   // global-norm clipping; 0 = none
  bool bf16_moments = false;  // AdamW's moments stored as bf16 (stochastic rounding)
  // SGD only (torch.optim.SGD's meaning).
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  // Adafactor only (torch.optim.Adafactor's meaning and defaults; `weight_decay` is decoupled,
  // times lr): beta2_t = 1 - t^beta2_decay; eps1 (<= 0: float32's epsilon) floors the variance
  // estimate, eps2 the parameter RMS of the relative step; clip_threshold clips the update's RMS.
  double beta2_decay = -0.8;
  double eps1 = 0;
  double eps2 = 1e-3;
  double clip_threshold = 1.0;
};

// Learning-rate schedules: constant, or linear warm-up then cosine decay to lr * min_lr_ratio at
// total_steps.
struct LrSchedule {
  enum class Kind { kConstant, kWarmupCosine };
  Kind kind = Kind::kConstant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr_ratio = 0;
  // Learning rate for optimizer step `step` (1-based).
  double At(double base_lr, int64_t step) const;
};

}  // namespace rp::spec
