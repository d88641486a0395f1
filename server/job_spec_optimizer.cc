#include "server/job_spec_optimizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

// AdamW hyper-parameters, the learning-rate schedule and the optimizer mode.
absl::Status ResolveOptimizer(const v1::JobSpec& spec, const JobSpecContext& ctx, ResolvedJob& r) {
  scheduler::JobSpec& e = r.engine;
  const v1::OptimizerSpec& o = spec.optimizer();
  if (o.lr() < 0 || o.eps() < 0 || o.weight_decay() < 0 || o.max_grad_norm() < 0) {
    return absl::InvalidArgumentError("optimizer: lr, eps, weight_decay and max_grad_norm must not be negative");
  }
  if (o.lr() > 1 || o.eps() > 1 || o.weight_decay() > 1) {
    return absl::InvalidArgumentError("optimizer: lr, eps and weight_decay must be at most 1");
  }
  if (o.max_grad_norm() > 1e6) return absl::InvalidArgumentError("optimizer.max_grad_norm: at most 1e6 (0 = no clip)");
  if (o.beta1() < 0 || o.beta1() >= 1 || o.beta2() < 0 || o.beta2() >= 1) {
    return absl::InvalidArgumentError("optimizer: beta1 and beta2 must lie in [0, 1)");
  }
  // The optimizer computes in float32: a beta that rounds to 1 there divides by zero at step 1.
  for (const auto& [name, beta] : {std::pair<const char*, double>{"beta1", o.beta1()}, {"beta2", o.beta2()}}) {
    if (static_cast<float>(beta) >= 1.0f) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "optimizer.%s: %.17g rounds to 1 in the optimizer's float32 arithmetic (at most 0.99999994)", name, beta));
    }
  }
  using Algorithm = spec::OptimizerAlgorithm;
  switch (o.algorithm()) {
    case v1::OPTIMIZER_ALGORITHM_UNSPECIFIED:
    case v1::OPTIMIZER_ALGORITHM_ADAMW:
      e.optimizer.algorithm = Algorithm::kAdamW;
      break;
    case v1::OPTIMIZER_ALGORITHM_SGD:
      e.optimizer.algorithm = Algorithm::kSgd;
      break;
    case v1::OPTIMIZER_ALGORITHM_LION:
      e.optimizer.algorithm = Algorithm::kLion;
      break;
    case v1::OPTIMIZER_ALGORITHM_ADAFACTOR:
      e.optimizer.algorithm = Algorithm::kAdafactor;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("optimizer.algorithm: unknown value ", o.algorithm()));
  }
  if (o.bf16_moments() && e.optimizer.algorithm != Algorithm::kAdamW) {
    return absl::InvalidArgumentError("optimizer.bf16_moments: only AdamW has moments to store in bf16");
  }
  if (e.optimizer.algorithm != Algorithm::kSgd && (o.momentum() != 0 || o.dampening() != 0 || o.nesterov())) {
    return absl::InvalidArgumentError("optimizer: momentum, dampening and nesterov are SGD's (set algorithm SGD)");
  }
  if (o.momentum() < 0 || o.momentum() >= 1 || o.dampening() < 0 || o.dampening() > 1) {
    return absl::InvalidArgumentError("optimizer: momentum must lie in [0, 1) and dampening in [0, 1]");
  }
  if (o.nesterov() && (o.momentum() == 0 || o.dampening() != 0)) {
    return absl::InvalidArgumentError("optimizer.nesterov: needs momentum > 0 and dampening 0");
  }
  const bool adafactor = e.optimizer.algorithm == Algorithm::kAdafactor;
  if (!adafactor && (o.beta2_decay() != 0 || o.eps1() != 0 || o.eps2() != 0 || o.clip_threshold() != 0)) {
    return absl::InvalidArgumentError(
        "optimizer: beta2_decay, eps1, eps2 and clip_threshold are Adafactor's (set algorithm ADAFACTOR)");
  }
  if (adafactor) {
    if (o.beta1() != 0 || o.beta2() != 0 || o.eps() != 0) {
      return absl::InvalidArgumentError(
          "optimizer: Adafactor has no beta1, beta2 or eps (its second-moment decay is beta2_decay, its floors "
          "eps1 and eps2)");
    }
    if (!(o.beta2_decay() <= 0) || o.beta2_decay() < -1e3) {
      return absl::InvalidArgumentError("optimizer.beta2_decay: must lie in [-1000, 0] (default -0.8)");
    }
    if (!(o.eps1() >= 0 && o.eps1() < 1) || !(o.eps2() >= 0 && o.eps2() < 1)) {
      return absl::InvalidArgumentError("optimizer: eps1 and eps2 must lie in [0, 1)");
    }
    if (o.clip_threshold() != 0 && !(o.clip_threshold() >= 1 && o.clip_threshold() <= 1e6)) {
      return absl::InvalidArgumentError("optimizer.clip_threshold: must lie in [1, 1e6] (default 1)");
    }
    e.optimizer.beta2_decay = o.beta2_decay() != 0 ? o.beta2_decay() : -0.8;
    e.optimizer.eps1 = o.eps1();
    e.optimizer.eps2 = o.eps2() > 0 ? o.eps2() : 1e-3;
    e.optimizer.clip_threshold = o.clip_threshold() > 0 ? o.clip_threshold() : 1.0;
  }
  e.optimizer.momentum = o.momentum();
  e.optimizer.dampening = o.dampening();
  e.optimizer.nesterov = o.nesterov();
  e.optimizer.lr = o.lr() > 0 ? o.lr() : adafactor ? 1e-2 : 1e-4;
  e.optimizer.beta1 = o.beta1() > 0 ? o.beta1() : 0.9;
  e.optimizer.beta2 = o.beta2() > 0 ? o.beta2() : e.optimizer.algorithm == Algorithm::kLion ? 0.99 : 0.999;
  e.optimizer.eps = o.eps() > 0 ? o.eps() : 1e-8;
  e.optimizer.weight_decay = o.weight_decay();
  e.optimizer.max_grad_norm = o.max_grad_norm();
  e.optimizer.bf16_moments = o.bf16_moments();
  const v1::LrScheduleSpec& ls = o.lr_schedule();
  if (ls.warmup_steps() < 0 || ls.total_steps() < 0 || ls.min_lr_ratio() < 0 || ls.min_lr_ratio() > 1) {
    return absl::InvalidArgumentError(
        "optimizer.lr_schedule: warmup_steps and total_steps must be >= 0, min_lr_ratio in [0, 1]");
  }
  if (ls.kind() == v1::LrScheduleSpec::KIND_WARMUP_COSINE) {
    const int64_t total = ls.total_steps() > 0 ? ls.total_steps() : spec.max_steps();
    if (total <= 0) {
      return absl::InvalidArgumentError("optimizer.lr_schedule: warmup_cosine needs total_steps (or max_steps) > 0");
    }
    e.lr_schedule = {spec::LrSchedule::Kind::kWarmupCosine, ls.warmup_steps(), total, ls.min_lr_ratio()};
  }
  e.optimizer_mode =
      o.mode() == v1::OPTIMIZER_MODE_SYNC ? planning::OptimizerMode::kSync : planning::OptimizerMode::kAsync;
  return absl::OkStatus();
}

}  // namespace rp::server
