#include "workers/optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace rp::workers {

double LrSchedule::At(double base_lr, int64_t step) const {
  if (kind == Kind::kConstant) return base_lr;
  if (warmup_steps > 0 && step <= warmup_steps) {
    return base_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  const int64_t decay = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay));
  const double min_lr = base_lr * min_lr_ratio;
  return min_lr + (base_lr - min_lr) * 0.5 * (1 + std::cos(M_PI * progress));
}

double AdamW::GradNorm(const HostModelStore& store) {
  double sq = 0;
  for (int i = 0; i < store.num_params(); ++i) {
    const HostParam& p = store.param(i);
    if (p.trainable) sq += p.grad.to(at::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(sq);
}

void AdamW::StepParam(HostModelStore& store, int i, const at::Tensor& grad, double lr, double grad_multiplier) {
  if (static_cast<int>(m_.size()) != store.num_params()) {
    m_.resize(static_cast<size_t>(store.num_params()));
    v_.resize(static_cast<size_t>(store.num_params()));
  }
  HostParam& p = store.param(i);
  const double bc1 = 1 - std::pow(opt_.beta1, static_cast<double>(step_));
  const double bc2 = 1 - std::pow(opt_.beta2, static_cast<double>(step_));
  at::Tensor g = grad_multiplier != 1.0 ? grad * grad_multiplier : grad;
  at::Tensor& m = m_[static_cast<size_t>(i)];
  at::Tensor& v = v_[static_cast<size_t>(i)];
  if (!m.defined()) {
    m = at::zeros_like(p.fp32);
    v = at::zeros_like(p.fp32);
  }
  p.fp32.mul_(1 - lr * opt_.weight_decay);
  m.lerp_(g, 1 - opt_.beta1);
  v.mul_(opt_.beta2).addcmul_(g, g, 1 - opt_.beta2);
  at::Tensor denom = (v.sqrt() / std::sqrt(bc2)).add_(opt_.eps);
  p.fp32.addcdiv_(m, denom, -lr / bc1);
}

absl::StatusOr<double> AdamW::Step(HostModelStore& store, double lr, double grad_divisor) {
  const int n = store.num_params();
  if (static_cast<int>(m_.size()) != n) {
    m_.assign(static_cast<size_t>(n), at::Tensor());
    v_.assign(static_cast<size_t>(n), at::Tensor());
  }
  const double norm = GradNorm(store) / grad_divisor;
  if (!std::isfinite(norm)) {
    return absl::FailedPreconditionError(absl::StrCat("optimizer: gradient norm is ", norm, "; step skipped"));
  }
  double clip = 1.0 / grad_divisor;
  if (opt_.max_grad_norm > 0 && norm > opt_.max_grad_norm) clip *= opt_.max_grad_norm / (norm + 1e-6);
  BeginStep();
  for (int i = 0; i < n; ++i) {
    if (store.param(i).trainable) StepParam(store, i, store.param(i).grad, lr, clip);
  }
  store.RefreshMaster();
  return norm;
}

}  // namespace rp::workers
