// host_model_store.h — the model states in host memory (paper §3.1): per trainable parameter the
// fp32 optimizer copy and the fp32 gradient accumulation buffer; per parameter the
// low-precision master copy that workers upload (fp32, bf16 or fp16, chosen per job); frozen
// parameters live only in the master copy.
//
// Contract: the store owns every host tensor. Parameters are addressed by index; layers list
// their parameter indices (a tied head lists the embedding's). Workers read master copies and
// call AccumulateGrad from stream threads: gradient accumulation is serialized per parameter
// (one mutex each), so two stages that share a parameter (tied embeddings) may download at
// once. The optimizer side (StepOptimizer, ZeroGrads, master refresh) must not run while a
// stage of the same iteration is in flight (the controller guarantees it in sync mode).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "workers/base/mutex.h"
#include "workers/device/pacer.h"
#include "workers/spec/model_config.h"

namespace rp::workers {

struct HostParam {
  std::string name;
  std::vector<int64_t> shape;
  bool trainable = true;
  at::Tensor fp32;      // optimizer copy (trainable only)
  at::Tensor master;    // what workers upload, in the master dtype
  bool mapped = false;  // master aliases a model file's mapping (file-backed pages, no copy)
  // The mapped master lies in memory registered for DMA (Device::RegisterHostMemory): uploads
  // copy from it asynchronously as from pinned memory, and RelocateMasters leaves it where it is.
  bool registered = false;
  at::Tensor grad;      // fp32 accumulation buffer (trainable only) — the "master gradient buffer"
  at::Tensor opt_grad;  // async mode: the optimizer's own copy, filled by G_cp (lazily allocated)
  // Room in the layer slab for this parameter's optimizer state: 1-D kByte, numel x
  // StateReserve::bytes_per_element (undefined when nothing is reserved). Never written by the
  // store: the optimizer carves its state out of it (TakeStateView) on its first step; until then
  // the pages stay untouched, so they cost no resident memory.
  at::Tensor state_reserve;
  // Serialises accumulation into `grad` by the stages of one iteration; the optimizer reads
  // `grad` after the per-layer gradient events (consistency.h), not under this lock.
  std::unique_ptr<base::Mutex> grad_mu = std::make_unique<base::Mutex>();
};

// How a store starts the parameters it will not train (a LoRA base).
enum class FrozenInit {
  kRandom,    // like every parameter: from the seed
  kDeferred,  // no master yet (a loader gives one: LoadHfWeights maps it); no random draws, so
              // the adapters' initial values differ from a kRandom store of the same seed
};

// What the optimizer will keep per trainable element, so the store can reserve it in the layer
// slab (workers/optim/adamw.h StateBytesPerElement): AdamW 8 (12 with AMSGrad), AdamW with bf16
// moments 4, SGD with momentum and Lion 4, Adafactor 0 (its factored state is small and stays
// separate).
struct StateReserve {
  int64_t bytes_per_element = 0;
};

// A view of `bytes` bytes at `offset` of p.state_reserve as a contiguous tensor of `dtype` and
// `shape`; undefined when p reserves too little (the caller then allocates as before).
at::Tensor TakeStateView(const HostParam& p, int64_t offset, at::ScalarType dtype, at::IntArrayRef shape);

class HostModelStore {
 public:
  // Random initialisation (normal(0, init_std) for matrices, ones for norms) from `seed`.
  // Throws std::bad_alloc (c10::Error) when host memory runs out.
  HostModelStore(const spec::ModelConfig& cfg, at::ScalarType master_dtype, uint64_t seed, double init_std = 0.02,
                 FrozenInit frozen = FrozenInit::kRandom, StateReserve reserve = {});

  // A data-free store for paced benchmarks (device/paced_device.h): every tensor lives on the
  // meta device (shapes and byte counts, no memory), AccumulateGrad does nothing and the
  // optimizers take `pacer`'s time instead of stepping. Never for training.
  static std::unique_ptr<HostModelStore> DataFree(const spec::ModelConfig& cfg, at::ScalarType master_dtype,
                                                  std::shared_ptr<const Pacer> pacer);
  // Non-null for a data-free store.
  const Pacer* pacer() const { return pacer_.get(); }

  const spec::ModelConfig& config() const { return cfg_; }
  at::ScalarType master_dtype() const { return master_dtype_; }
  int num_params() const { return static_cast<int>(params_.size()); }
  HostParam& param(int i) { return params_[static_cast<size_t>(i)]; }
  const HostParam& param(int i) const { return params_[static_cast<size_t>(i)]; }
  const std::vector<int>& layer_params(int layer) const { return layer_params_[static_cast<size_t>(layer)]; }
  int FindParam(const std::string& name) const;  // -1 if absent

  // Adds a device gradient (any dtype/device) into the fp32 buffer of parameter i.
  void AccumulateGrad(int i, const at::Tensor& grad);
  void ZeroGrads();
  // Re-derives every master copy from the fp32 copy (after an optimizer step or a load).
  void RefreshMaster();
  // Freezes a parameter: it keeps only its master copy (no fp32 copy, no gradient buffer, no
  // optimizer state) and workers upload it without requires_grad. Its room in the layer slab is
  // not returned (the slab is one allocation): freeze at construction time (FrozenInit) to save it.
  absl::Status Freeze(const std::string& name);
  // Overwrites parameter values (fp32 and master) by name; for loading and tests. A mapped
  // master is replaced by an owned copy (the file is never written).
  absl::Status SetValue(const std::string& name, const at::Tensor& value);
  // Makes `view` (master dtype and shape, e.g. a SafetensorsFile::View) the master of frozen
  // parameter i without a copy; `registered`: the view's memory is registered for DMA and the
  // view keeps that registration alive. InvalidArgument when i trains or the view does not fit.
  absl::Status AdoptMappedMaster(int i, at::Tensor view, bool registered = false);
  // Moves every master copy into memory from `alloc` (the CUDA backend's pinned arena, so
  // weight uploads are asynchronous DMA); values are kept. Registered masters stay where they
  // are (already DMA-able, no copy). Call before training starts.
  using HostAllocator = std::function<at::Tensor(at::IntArrayRef, at::ScalarType)>;
  void RelocateMasters(const HostAllocator& alloc);
  // Sum of the fp32 and master bytes, and of the gradient buffers (the async copy included),
  // that the store allocated
  // (anonymous memory); MappedBytes: the masters that alias model files instead.
  int64_t HostBytes() const;
  // The async optimizer's own gradient copy of parameter `p`, allocated on first use (the
  // optimizer worker's thread). Counted without reading the tensor, so HostBytes may run on any
  // thread while the optimizer allocates.
  void AllocateOptimizerGrad(HostParam& p);
  int64_t MappedBytes() const;
  int64_t RegisteredBytes() const;  // the mapped masters that are registered for DMA
  // The layer slabs: how many (one per layer that trains a parameter of its own) and their
  // bytes (fp32 copies, gradients and the state reserve, alignment padding included).
  // The state reserve serves one optimizer: the first to claim it (any token that identifies
  // it); true for that one from then on, false for any other (which allocates its own state).
  // Any thread.
  bool ClaimStateReserve(const void* optimizer);
  int num_slabs() const { return static_cast<int>(slabs_.size()); }
  int64_t SlabBytes() const;

 private:
  HostModelStore(const spec::ModelConfig& cfg, at::ScalarType master_dtype, uint64_t seed, double init_std,
                 FrozenInit frozen, StateReserve reserve, std::shared_ptr<const Pacer> pacer);

  spec::ModelConfig cfg_;
  at::ScalarType master_dtype_;
  std::shared_ptr<const Pacer> pacer_;  // data-free store (null: a real one)
  std::vector<HostParam> params_;
  std::vector<std::vector<int>> layer_params_;
  std::map<std::string, int> by_name_;
  std::vector<at::Tensor> slabs_;  // kByte, one per layer with trainable parameters of its own
  std::atomic<const void*> reserve_owner_{nullptr};
  std::atomic<int64_t> opt_grad_bytes_{0};  // AllocateOptimizerGrad's tensors
};

}  // namespace rp::workers
