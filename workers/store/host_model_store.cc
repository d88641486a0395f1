#include "workers/store/host_model_store.h"

#include <cmath>

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "workers/models/layers.h"

namespace rp::workers {

namespace {

constexpr int64_t kSlabAlignment = 64;
int64_t Aligned(int64_t bytes) { return (bytes + kSlabAlignment - 1) / kSlabAlignment * kSlabAlignment; }
int64_t Numel(const std::vector<int64_t>& shape) { return c10::multiply_integers(shape); }

// A contiguous fp32 tensor of `shape` at byte `offset` of `slab` (shares its storage).
at::Tensor FloatView(const at::Tensor& slab, int64_t offset, const std::vector<int64_t>& shape) {
  return slab.narrow(0, offset, Numel(shape) * 4).view(at::kFloat).view(shape);
}

// Draws parameter `spec`'s initial value into `t` (fp32, its shape) from `gen`.
void Initialise(const models::ParamSpec& spec, double init_std, at::Generator& gen, at::Tensor& t) {
  if (spec.is_norm) {
    t.fill_(1);
  } else if (spec.lora == 1) {  // PEFT's default: kaiming-uniform(a=sqrt(5)) = U(+-1/sqrt(in))
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.shape[1]));
    t.uniform_(-bound, bound, gen);
  } else if (spec.lora == 2) {  // B = 0: the adapted model starts as the base model
    t.zero_();
  } else {
    t.normal_(0, init_std, gen);
  }
}

}  // namespace

at::Tensor TakeStateView(const HostParam& p, int64_t offset, at::ScalarType dtype, at::IntArrayRef shape) {
  if (!p.state_reserve.defined()) return at::Tensor();
  const int64_t bytes = c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype));
  if (offset < 0 || offset + bytes > p.state_reserve.numel()) return at::Tensor();
  return p.state_reserve.narrow(0, offset, bytes).view(dtype).view(shape);
}

HostModelStore::HostModelStore(const spec::ModelConfig& cfg, at::ScalarType master_dtype, uint64_t seed,
                               double init_std, FrozenInit frozen, StateReserve reserve)
    : HostModelStore(cfg, master_dtype, seed, init_std, frozen, reserve, nullptr) {}

std::unique_ptr<HostModelStore> HostModelStore::DataFree(const spec::ModelConfig& cfg, at::ScalarType master_dtype,
                                                         std::shared_ptr<const Pacer> pacer) {
  return std::unique_ptr<HostModelStore>(
      new HostModelStore(cfg, master_dtype, 0, 0.02, FrozenInit::kRandom, {}, std::move(pacer)));
}

HostModelStore::HostModelStore(const spec::ModelConfig& cfg, at::ScalarType master_dtype, uint64_t seed,
                               double init_std, FrozenInit frozen, StateReserve reserve,
                               std::shared_ptr<const Pacer> pacer)
    : cfg_(cfg), master_dtype_(master_dtype), pacer_(std::move(pacer)) {
  const at::TensorOptions where = pacer_ ? at::TensorOptions().device(c10::kMeta) : at::TensorOptions();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  layer_params_.resize(static_cast<size_t>(cfg.num_layers()));
  for (int l = 0; l < cfg.num_layers(); ++l) {
    // The layer's own parameters (a tied one was created by an earlier layer), and the bytes of
    // its slab: per trainable parameter fp32 copy, gradient and state reserve.
    std::vector<models::ParamSpec> own;
    int64_t slab_bytes = 0;
    for (models::ParamSpec& spec : models::LayerParams(cfg, l)) {
      if (auto it = by_name_.find(spec.name); it != by_name_.end()) {
        layer_params_[static_cast<size_t>(l)].push_back(it->second);
        continue;
      }
      const bool base = cfg.lora.rank > 0 && spec.lora == 0;
      const int64_t n = Numel(spec.shape);
      if (!base) slab_bytes += 2 * Aligned(n * 4) + Aligned(n * reserve.bytes_per_element);
      by_name_[spec.name] = static_cast<int>(params_.size() + own.size());
      layer_params_[static_cast<size_t>(l)].push_back(by_name_[spec.name]);
      own.push_back(std::move(spec));
    }
    at::Tensor slab;
    if (slab_bytes > 0) {
      slab = at::empty({slab_bytes}, where.dtype(at::kByte));
      slabs_.push_back(slab);
    }
    int64_t offset = 0;
    for (const models::ParamSpec& spec : own) {
      HostParam p;
      p.name = spec.name;
      p.shape = spec.shape;
      const bool base = cfg.lora.rank > 0 && spec.lora == 0;
      if (base) {
        // LoRA: the base is frozen and lives in the master copy only (no fp32, no gradient);
        // a deferred one waits for the loader, which brings the master.
        p.trainable = false;
        if (frozen == FrozenInit::kRandom) {
          at::Tensor value = at::empty(spec.shape, where.dtype(at::kFloat));
          if (!pacer_) Initialise(spec, init_std, gen, value);
          p.master = value.to(master_dtype_);
        }
        params_.push_back(std::move(p));
        continue;
      }
      const int64_t n = Numel(spec.shape);
      p.fp32 = FloatView(slab, offset, spec.shape);
      offset += Aligned(n * 4);
      p.grad = FloatView(slab, offset, spec.shape);
      p.grad.zero_();
      offset += Aligned(n * 4);
      if (reserve.bytes_per_element > 0) p.state_reserve = slab.narrow(0, offset, n * reserve.bytes_per_element);
      offset += Aligned(n * reserve.bytes_per_element);
      if (!pacer_) Initialise(spec, init_std, gen, p.fp32);
      // Always a distinct tensor (to() would alias an fp32 master to the optimizer copy).
      p.master = p.fp32.to(master_dtype_, /*non_blocking=*/false, /*copy=*/true);
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
  if (!p.trainable || pacer_) return;  // frozen: there is no gradient buffer; data-free: no data
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
    p.registered = false;
  } else {
    p.master.copy_(value);
  }
  return absl::OkStatus();
}

absl::Status HostModelStore::AdoptMappedMaster(int i, at::Tensor view, bool registered) {
  HostParam& p = param(i);
  if (p.trainable)
    return absl::InvalidArgumentError(absl::StrCat("parameter ", p.name, " trains: it needs its own copy"));
  if (view.scalar_type() != master_dtype_ || view.sizes() != at::IntArrayRef(p.shape) || !view.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", p.name, ": the mapped tensor does not fit"));
  }
  p.master = std::move(view);
  p.mapped = true;
  p.registered = registered;
  return absl::OkStatus();
}

void HostModelStore::RelocateMasters(const HostAllocator& alloc) {
  for (HostParam& p : params_) {
    if (p.registered) continue;
    at::Tensor t = alloc(p.master.sizes(), p.master.scalar_type());
    t.copy_(p.master);
    p.master = std::move(t);
    p.mapped = false;
  }
}

int64_t HostModelStore::HostBytes() const {
  int64_t b = 0;
  for (const HostParam& p : params_) {
    for (const at::Tensor* t : {&p.fp32, &p.master, &p.grad}) {
      if (t->defined() && !(t == &p.master && p.mapped)) b += static_cast<int64_t>(t->nbytes());
    }
  }
  return b + opt_grad_bytes_.load(std::memory_order_relaxed);
}

void HostModelStore::AllocateOptimizerGrad(HostParam& p) {
  p.opt_grad = at::zeros_like(p.grad);
  opt_grad_bytes_.fetch_add(static_cast<int64_t>(p.opt_grad.nbytes()), std::memory_order_relaxed);
}

bool HostModelStore::ClaimStateReserve(const void* optimizer) {
  const void* expected = nullptr;
  return reserve_owner_.compare_exchange_strong(expected, optimizer) || expected == optimizer;
}

int64_t HostModelStore::RegisteredBytes() const {
  int64_t b = 0;
  for (const HostParam& p : params_) {
    if (p.mapped && p.registered) b += static_cast<int64_t>(p.master.nbytes());
  }
  return b;
}

int64_t HostModelStore::SlabBytes() const {
  int64_t b = 0;
  for (const at::Tensor& s : slabs_) b += static_cast<int64_t>(s.nbytes());
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
