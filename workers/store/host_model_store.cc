#include "workers/store/host_model_store.h"

#include <cmath>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "workers/models/layers.h"

namespace rp::workers {

HostModelStore::HostModelStore(const models::TransformerConfig& cfg, at::ScalarType master_dtype, uint64_t seed,
                               double init_std, FrozenInit frozen)
    : cfg_(cfg), master_dtype_(master_dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  layer_params_.resize(static_cast<size_t>(cfg.num_layers()));
  for (int l = 0; l < cfg.num_layers(); ++l) {
    for (const models::ParamSpec& spec : models::LayerParams(cfg, l)) {
      auto it = by_name_.find(spec.name);
      if (it != by_name_.end()) {  // tied parameter: shared, not duplicated
        layer_params_[static_cast<size_t>(l)].push_back(it->second);
        continue;
      }
      HostParam p;
      p.name = spec.name;
      p.shape = spec.shape;
      const bool base = cfg.lora.rank > 0 && spec.lora == 0;
      if (base && frozen == FrozenInit::kDeferred) {  // the loader brings the master
        p.trainable = false;
        const int idx = static_cast<int>(params_.size());
        by_name_[spec.name] = idx;
        layer_params_[static_cast<size_t>(l)].push_back(idx);
        params_.push_back(std::move(p));
        continue;
      }
      if (spec.is_norm) {
        p.fp32 = at::ones(spec.shape, at::kFloat);
      } else if (spec.lora == 1) {  // PEFT's default: kaiming-uniform(a=sqrt(5)) = U(+-1/sqrt(in))
        const double bound = 1.0 / std::sqrt(static_cast<double>(spec.shape[1]));
        p.fp32 = at::empty(spec.shape, at::kFloat);
        p.fp32.uniform_(-bound, bound, gen);
      } else if (spec.lora == 2) {  // B = 0: the adapted model starts as the base model
        p.fp32 = at::zeros(spec.shape, at::kFloat);
      } else {
        p.fp32 = at::empty(spec.shape, at::kFloat);
        p.fp32.normal_(0, init_std, gen);
      }
      // Always a distinct tensor (to() would alias an fp32 master to the optimizer copy).
      p.master = p.fp32.to(master_dtype_, /*non_blocking=*/false, /*copy=*/true);
      if (base) {
        // LoRA: the base is frozen and lives in the master copy only (no fp32, no gradient).
        p.trainable = false;
        p.fp32 = at::Tensor();
      } else {
        p.grad = at::zeros(spec.shape, at::kFloat);
      }
      const int idx = static_cast<int>(params_.size());
      by_name_[spec.name] = idx;
      layer_params_[static_cast<size_t>(l)].push_back(idx);
      params_.push_back(std::move(p));
    }
  }
}

int HostModelStore::FindParam(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

void HostModelStore::AccumulateGrad(int i, const at::Tensor& grad) {
  HostParam& p = param(i);
  if (!p.trainable) return;  // frozen: there is no gradient buffer
  at::Tensor g = grad.to(at::kCPU, at::kFloat);
  base::MutexLock lock(p.grad_mu.get());
  p.grad.add_(g);
}

void HostModelStore::ZeroGrads() {
  for (HostParam& p : params_) {
    if (p.grad.defined()) p.grad.zero_();
  }
}

void HostModelStore::RefreshMaster() {
  for (HostParam& p : params_) {
    if (p.fp32.defined()) p.master.copy_(p.fp32);
  }
}

absl::Status HostModelStore::Freeze(const std::string& name) {
  const int i = FindParam(name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no parameter named ", name));
  HostParam& p = param(i);
  p.trainable = false;
  p.fp32 = at::Tensor();
  p.grad = at::Tensor();
  return absl::OkStatus();
}

absl::Status HostModelStore::SetValue(const std::string& name, const at::Tensor& value) {
  const int i = FindParam(name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("no parameter named ", name));
  HostParam& p = param(i);
  if (value.sizes() != at::IntArrayRef(p.shape)) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", name, ": shape [", absl::StrJoin(value.sizes(), ","),
                                                   "] does not match [", absl::StrJoin(p.shape, ","), "]"));
  }
  if (p.fp32.defined()) p.fp32.copy_(value);
  if (p.mapped || !p.master.defined()) {
    p.master = value.to(at::kCPU, master_dtype_, /*non_blocking=*/false, /*copy=*/true);
    p.mapped = false;
  } else {
    p.master.copy_(value);
  }
  return absl::OkStatus();
}

absl::Status HostModelStore::AdoptMappedMaster(int i, at::Tensor view) {
  HostParam& p = param(i);
  if (p.trainable)
    return absl::InvalidArgumentError(absl::StrCat("parameter ", p.name, " trains: it needs its own copy"));
  if (view.scalar_type() != master_dtype_ || view.sizes() != at::IntArrayRef(p.shape) || !view.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", p.name, ": the mapped tensor does not fit"));
  }
  p.master = std::move(view);
  p.mapped = true;
  return absl::OkStatus();
}

void HostModelStore::RelocateMasters(const HostAllocator& alloc) {
  for (HostParam& p : params_) {
    at::Tensor t = alloc(p.master.sizes(), p.master.scalar_type());
    t.copy_(p.master);
    p.master = std::move(t);
    p.mapped = false;
  }
}

int64_t HostModelStore::HostBytes() const {
  int64_t b = 0;
  for (const HostParam& p : params_) {
    for (const at::Tensor* t : {&p.fp32, &p.master, &p.grad, &p.opt_grad}) {
      if (t->defined() && !(t == &p.master && p.mapped)) b += static_cast<int64_t>(t->nbytes());
    }
  }
  return b;
}

int64_t HostModelStore::MappedBytes() const {
  int64_t b = 0;
  for (const HostParam& p : params_) {
    if (p.mapped) b += static_cast<int64_t>(p.master.nbytes());
  }
  return b;
}

}  // namespace rp::workers
