#include "workers/optim/adamw.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "workers/base/check.h"
#include "workers/optim/cpu_adafactor.h"
#include "workers/optim/cpu_adamw.h"
#include "workers/optim/cpu_momentum.h"
#include "workers/optim/step_policy.h"

namespace rp::workers {

double AdamW::GradNorm(const HostModelStore& store) {
  if (store.pacer()) return 0;  // a data-free store has no gradient values
  double sq = 0;
  for (int i = 0; i < store.num_params(); ++i) {
    const HostParam& p = store.param(i);
    if (p.trainable) sq += std::pow(at::norm(p.grad, 2, at::kDouble).item<double>(), 2);
  }
  return std::sqrt(sq);
}

std::optional<std::vector<int64_t>> AdafactorStateShape(char which, const std::vector<int64_t>& shape) {
  if (shape.size() < 2) {
    if (which == 'v') return shape;
    return std::nullopt;
  }
  std::vector<int64_t> s = shape;
  if (which == 'm') {
    s.back() = 1;
  } else {
    s[s.size() - 2] = 1;
  }
  return s;
}

StateReserve StateBytesPerElement(const AdamWOptions& o) {
  switch (o.algorithm) {
    case spec::OptimizerAlgorithm::kAdamW:
      return {o.bf16_moments ? 4 : (o.amsgrad ? 12 : 8)};
    case spec::OptimizerAlgorithm::kSgd:
      return {o.momentum != 0 ? 4 : 0};
    case spec::OptimizerAlgorithm::kLion:
      return {4};
    case spec::OptimizerAlgorithm::kAdafactor:
      return {0};
  }
  return {0};
}

namespace {

// State buffer `slot` (AdamW: 0 m, 1 v, 2 AMSGrad's maximum; SGD/Lion: 0) of parameter `p`, as a
// contiguous `dtype` tensor of `shape`. With room reserved in p's layer slab it lives there: kept
// when `current` already is that view, else filled from `current` (a restored checkpoint's,
// converted) or zeros. Without a reserve (or `reserved` false: another optimizer owns it):
// `current` converted, or a new zeros tensor.
at::Tensor PlaceState(const HostParam& p, bool reserved, int slot, at::ScalarType dtype, at::IntArrayRef shape,
                      const at::Tensor& current) {
  const int64_t offset = slot * c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype));
  // Every step after the first: the state already lives where it belongs (no views built).
  if (current.defined() && current.scalar_type() == dtype && current.is_contiguous()) {
    if (!reserved || !p.state_reserve.defined() ||
        current.data_ptr() == static_cast<char*>(p.state_reserve.data_ptr()) + offset) {
      return current;
    }
  }
  at::Tensor view;
  if (reserved) view = TakeStateView(p, offset, dtype, shape);
  if (view.defined()) {
    if (current.defined()) {
      view.copy_(current.view(shape));
    } else {
      view.zero_();
    }
    return view;
  }
  if (!current.defined()) return at::zeros(shape, dtype);
  if (current.scalar_type() == dtype && current.is_contiguous()) return current;
  return current.to(dtype).contiguous();
}

}  // namespace

OptimizerThreads* AdamW::Pool() {
  if (!pool_) pool_ = std::make_shared<OptimizerThreads>(threads());
  return pool_.get();
}

void AdamW::AccountState(size_t i) {
  int64_t bytes = 0;
  for (const std::vector<at::Tensor>* side : {&m_, &v_, &vmax_}) {
    if (i < side->size() && (*side)[i].defined()) bytes += static_cast<int64_t>((*side)[i].nbytes());
  }
  if (state_bytes_of_.size() <= i) state_bytes_of_.resize(i + 1, 0);
  state_bytes_->fetch_add(bytes - state_bytes_of_[i], std::memory_order_relaxed);
  state_bytes_of_[i] = bytes;
}

void AdamW::StepParam(HostModelStore& store, int i, const at::Tensor& grad, double lr, double grad_multiplier,
                      bool write_master) {
  if (const Pacer* pacer = store.pacer()) {  // data-free: the step takes the paced time
    pacer->Spend(pacer->OptimizerSeconds(static_cast<int64_t>(store.param(i).fp32.nbytes())));
    return;
  }
  StepParamUnaccounted(store, i, grad, lr, grad_multiplier, write_master);
  AccountState(static_cast<size_t>(i));
}

void AdamW::StepParamUnaccounted(HostModelStore& store, int i, const at::Tensor& grad, double lr,
                                 double grad_multiplier, bool write_master) {
  // Every side sized together (set_state sizes m_ and v_ from a checkpoint; AMSGrad's maximum
  // is not in checkpoints and starts again at zero).
  for (std::vector<at::Tensor>* side : {&m_, &v_, &vmax_}) side->resize(static_cast<size_t>(store.num_params()));
  HostParam& p = store.param(i);
  const at::Tensor g =
      grad.scalar_type() == at::kFloat && grad.is_contiguous() ? grad : grad.to(at::kFloat).contiguous();
  ParamStep ps{p, i, g, store.ClaimStateReserve(reserve_token_.get()), lr, grad_multiplier, write_master};
  if (write_master) {
    ps.master_dtype = p.master.scalar_type() == at::kBFloat16 ? MasterDtype::kBFloat16
                      : p.master.scalar_type() == at::kHalf   ? MasterDtype::kFloat16
                                                              : MasterDtype::kFloat32;
  }
  switch (opt_.algorithm) {
    case spec::OptimizerAlgorithm::kAdafactor:
      return StepAdafactor(ps);
    case spec::OptimizerAlgorithm::kSgd:
    case spec::OptimizerAlgorithm::kLion:
      return StepMomentum(ps);
    case spec::OptimizerAlgorithm::kAdamW:
      return StepAdamW(ps);
  }
}

void AdamW::StepAdafactor(const ParamStep& ps) {
  RP_CHECK(!opt_.bf16_moments && !opt_.amsgrad) << "bf16 moments and amsgrad are AdamW's";
  HostParam& p = ps.p;
  at::Tensor& m = m_[static_cast<size_t>(ps.index)];
  at::Tensor& v = v_[static_cast<size_t>(ps.index)];
  const std::vector<int64_t>& shape = p.shape;
  for (auto [which, state] : {std::pair{'m', &m}, std::pair{'v', &v}}) {
    const auto want = AdafactorStateShape(which, shape);
    if (!want) continue;
    // Small factored state: allocated on its own (reserved false), never in the layer slab.
    *state = PlaceState(p, /*reserved=*/false, 0, at::kFloat, *want, *state);
    RP_CHECK(state->sizes().vec() == *want) << "Adafactor state of " << p.name << " has the wrong shape";
  }
  AdafactorBuffers b;
  b.param = p.fp32.data_ptr<float>();
  b.grad = ps.grad.data_ptr<float>();
  AdafactorShape s;
  if (shape.size() >= 2) {
    s.rows = shape[shape.size() - 2];
    s.cols = shape.back();
    for (size_t k = 0; k + 2 < shape.size(); ++k) s.batch *= shape[k];
    b.row_var = m.data_ptr<float>();
    b.col_var = v.data_ptr<float>();
  } else {
    s.cols = p.fp32.numel();
    b.variance = v.data_ptr<float>();
  }
  if (ps.write_master) {
    b.master = p.master.data_ptr();
    b.master_dtype = ps.master_dtype;
  }
  AdafactorHyper h;
  h.lr = ps.lr;
  h.beta2_decay = opt_.beta2_decay;
  h.eps1 = opt_.eps1;
  h.eps2 = opt_.eps2;
  h.d = opt_.clip_threshold;
  h.weight_decay = opt_.weight_decay;
  h.maximize = opt_.maximize;
  h.step = step_;
  h.grad_scale = static_cast<float>(ps.grad_multiplier);
  FusedAdafactor(b, s, h, opt_.simd, Pool());
}

void AdamW::StepMomentum(const ParamStep& ps) {
  RP_CHECK(!opt_.bf16_moments && !opt_.amsgrad) << "bf16 moments and amsgrad are AdamW's";
  HostParam& p = ps.p;
  at::Tensor& m = m_[static_cast<size_t>(ps.index)];
  MomentumBuffers b{p.fp32.data_ptr<float>(), ps.grad.data_ptr<float>(), nullptr,
                    ps.write_master ? p.master.data_ptr() : nullptr, ps.master_dtype};
  const bool has_buffer = opt_.algorithm == spec::OptimizerAlgorithm::kLion || opt_.momentum != 0;
  const bool first = has_buffer && !m.defined();  // SGD's first step copies the gradient in
  if (has_buffer) {
    m = PlaceState(p, ps.reserved, /*slot=*/0, at::kFloat, p.fp32.sizes(), m);
    b.buffer = m.data_ptr<float>();
  }
  if (opt_.algorithm == spec::OptimizerAlgorithm::kSgd) {
    SgdHyper h;
    h.lr = static_cast<float>(ps.lr);
    h.momentum = static_cast<float>(opt_.momentum);
    h.dampening = static_cast<float>(opt_.dampening);
    h.weight_decay = static_cast<float>(opt_.weight_decay);
    h.nesterov = opt_.nesterov;
    h.maximize = opt_.maximize;
    h.first_step = first;
    h.grad_scale = static_cast<float>(ps.grad_multiplier);
    FusedSgd(b, p.fp32.numel(), h, opt_.simd, Pool());
    return;
  }
  LionHyper h;
  h.lr = static_cast<float>(ps.lr);
  h.beta1 = static_cast<float>(opt_.beta1);
  h.beta2 = static_cast<float>(opt_.beta2);
  h.weight_decay = static_cast<float>(opt_.weight_decay);
  h.maximize = opt_.maximize;
  h.grad_scale = static_cast<float>(ps.grad_multiplier);
  FusedLion(b, p.fp32.numel(), h, opt_.simd, Pool());
}

void AdamW::StepAdamW(const ParamStep& ps) {
  HostParam& p = ps.p;
  at::Tensor& m = m_[static_cast<size_t>(ps.index)];
  at::Tensor& v = v_[static_cast<size_t>(ps.index)];
  at::Tensor& vmax = vmax_[static_cast<size_t>(ps.index)];
  const at::ScalarType moment_dtype = opt_.bf16_moments ? at::kBFloat16 : at::kFloat;
  // A checkpoint's moments are read as fp32; bf16 values round-trip exactly.
  m = PlaceState(p, ps.reserved, 0, moment_dtype, p.fp32.sizes(), m);
  v = PlaceState(p, ps.reserved, 1, moment_dtype, p.fp32.sizes(), v);
  if (opt_.amsgrad) vmax = PlaceState(p, ps.reserved, 2, at::kFloat, p.fp32.sizes(), vmax);
  AdamWHyper h;
  h.lr = static_cast<float>(ps.lr);
  h.beta1 = static_cast<float>(opt_.beta1);
  h.beta2 = static_cast<float>(opt_.beta2);
  h.eps = static_cast<float>(opt_.eps);
  h.weight_decay = static_cast<float>(opt_.weight_decay);
  h.step = step_;
  h.grad_scale = static_cast<float>(ps.grad_multiplier);
  h.amsgrad = opt_.amsgrad;
  h.maximize = opt_.maximize;
  void* master = ps.write_master ? p.master.data_ptr() : nullptr;
  if (opt_.bf16_moments) {
    // Each parameter its own rounding stream (seed and index), so no two tensors share bits.
    AdamWBf16MomentBuffers b{p.fp32.data_ptr<float>(),
                             ps.grad.data_ptr<float>(),
                             static_cast<uint16_t*>(m.data_ptr()),
                             static_cast<uint16_t*>(v.data_ptr()),
                             master,
                             ps.master_dtype};
    FusedAdamWBf16Moments(b, p.fp32.numel(), h, opt_.rounding_seed * 1000003u + static_cast<uint64_t>(ps.index),
                          opt_.simd, Pool());
    return;
  }
  AdamWBuffers b;
  b.param = p.fp32.data_ptr<float>();
  b.grad = ps.grad.data_ptr<float>();
  b.exp_avg = m.data_ptr<float>();
  b.exp_avg_sq = v.data_ptr<float>();
  b.max_exp_avg_sq = opt_.amsgrad ? vmax.data_ptr<float>() : nullptr;
  if (ps.write_master) {
    b.master = master;
    b.master_dtype = ps.master_dtype;
  }
  FusedAdamW(b, p.fp32.numel(), h, opt_.simd, Pool());
}

absl::StatusOr<double> AdamW::Step(HostModelStore& store, double lr, double grad_divisor) {
  const StepDecision d = DecideStep(GradNorm(store), grad_divisor, opt_.max_grad_norm, /*scaler=*/nullptr);
  if (!d.status.ok()) return d.status;
  StepAll(store, lr, d.multiplier);
  return d.grad_norm;
}

void AdamW::StepAll(HostModelStore& store, double lr, double grad_multiplier) {
  const int n = store.num_params();
  BeginStep();
  for (int i = 0; i < n; ++i) {
    if (store.param(i).trainable) StepParam(store, i, store.param(i).grad, lr, grad_multiplier, /*write_master=*/true);
  }
}

}  // namespace rp::workers
