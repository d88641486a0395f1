// adamw.h — the optimizer step of the synchronous engine: global-norm gradient clipping and
// AdamW on the host fp32 copies, then the master copies refreshed (paper §2.1.2).
//
// Contract: not thread-safe; the caller owns the HostModelStore exclusively while stepping
// (sync mode: after every stage of the iteration finished). The update follows
// torch.optim.AdamW (decoupled weight decay; bias-corrected moments; eps added after the
// bias-corrected square root; amsgrad, maximize) so a plain LibTorch run is an exact reference.
// The arithmetic is the fused SIMD kernel of cpu_adamw.h. The same class steps SGD and Lion
// (options.algorithm; cpu_momentum.h): one state buffer per parameter in `m`, none in `v`; and
// Adafactor (cpu_adafactor.h): factored row/column variances in `m`/`v` (AdafactorStateShape).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workers/optim/cpu_adamw.h"
#include "workers/optim/optimizer_threads.h"
#include "workers/spec/optimizer_spec.h"
#include "workers/store/host_model_store.h"

namespace rp::workers {

// The shapes of Adafactor's state for a parameter of `shape` (torch.optim.Adafactor's): "m" the
// row variances (shape with its last dimension 1), "v" the column variances (shape with its
// second-to-last dimension 1) for 2+ dimensions; for fewer, no "m" and "v" the full variance.
// Empty optional: no such buffer.
std::optional<std::vector<int64_t>> AdafactorStateShape(char which, const std::vector<int64_t>& shape);

// The job's update rule (spec::OptimizerSpec: algorithm, coefficients, clipping) and how this
// process runs it.
struct AdamWOptions : spec::OptimizerSpec {
  bool amsgrad = false;   // AdamW only (torch.optim.AdamW's meaning)
  bool maximize = false;  // AdamW only
  // The optimizer's own threads for the fused step (optimizer_threads.h); 0 = every core.
  int threads = 0;
  // The kernels' vector width (cpu_adamw.h SimdPath): kAuto = the widest this CPU has; tests and
  // benchmarks force the narrower paths that other hosts run.
  SimdPath simd = SimdPath::kAuto;
  // With bf16_moments: the stochastic rounding's seed (cpu_adamw.h, FusedAdamWBf16Moments).
  uint64_t rounding_seed = 0;
};

// The bytes per trainable element the optimizer's state takes, for HostModelStore to reserve in
// its layer slabs (host_model_store.h StateReserve): the state then lives beside each
// parameter's fp32 copy, one allocation per layer. Adafactor reserves nothing (factored state).
StateReserve StateBytesPerElement(const AdamWOptions& o);

// Everything AdamW carries between steps (a checkpoint saves it): the step count (bias
// correction) and the first/second moments per parameter index (undefined = not stepped yet).
struct AdamWState {
  int64_t step = 0;
  std::vector<at::Tensor> m, v;
};

class AdamW {
 public:
  explicit AdamW(AdamWOptions o) : opt_(o) {}
  // One step with learning rate `lr` over every trainable parameter of `store` using its fp32
  // gradient buffers (already summed over micro-batches) divided by `grad_divisor` (the loss
  // scale). Returns the global gradient norm (unscaled, before clipping). Non-finite gradients
  // are an error and leave the weights and the step count untouched.
  // The decision is workers/optim/step_policy.h's, as in the asynchronous optimizer.
  absl::StatusOr<double> Step(HostModelStore& store, double lr, double grad_divisor = 1.0);
  // The update itself once decided: every trainable gradient times `grad_multiplier`, masters
  // written in the same pass.
  void StepAll(HostModelStore& store, double lr, double grad_multiplier);
  // The global norm of the (scaled) gradient buffers; +inf/NaN when any element is not finite.
  static double GradNorm(const HostModelStore& store);

  // The same update split for the layerwise (asynchronous) optimizer: BeginStep once per
  // optimizer step, then StepParam for each trainable parameter with its gradient multiplied by
  // `grad_multiplier` (unscale x clip).
  void BeginStep() { ++step_; }
  // With write_master the fused kernel also writes the master copy (P_cp in the same pass; sync
  // mode); the asynchronous optimizer passes false and copies later, when the protocol allows.
  void StepParam(HostModelStore& store, int index, const at::Tensor& grad, double lr, double grad_multiplier,
                 bool write_master = false);
  int64_t steps() const { return step_; }
  // Bytes of the optimizer's state tensors (moments, AMSGrad's maximum), as allocated so far.
  // Any thread, also while a step runs (the value before or after that parameter's step).
  int64_t StateBytes() const { return state_bytes_->load(std::memory_order_relaxed); }
  // Shallow views of the state; take it only while no step runs.
  AdamWState state() const { return {step_, m_, v_}; }
  void set_state(AdamWState s) {
    step_ = s.step;
    m_ = std::move(s.m);
    v_ = std::move(s.v);
    vmax_.assign(m_.size(), at::Tensor());
    state_bytes_of_.assign(m_.size(), 0);
    state_bytes_->store(0);
    for (size_t i = 0; i < m_.size(); ++i) AccountState(i);
  }
  const AdamWOptions& options() const { return opt_; }
  int threads() const { return opt_.threads > 0 ? opt_.threads : OptimizerThreads::DefaultSize(false, 0); }

 private:
  AdamWOptions opt_;
  // Started by the first step, so an AdamW that never steps (the controller's in async mode,
  // where the optimizer worker steps) holds no threads.
  std::shared_ptr<OptimizerThreads> pool_;
  OptimizerThreads* Pool();
  void StepParamUnaccounted(HostModelStore& store, int index, const at::Tensor& grad, double lr, double grad_multiplier,
                            bool write_master);
  // One parameter's step, as StepParamUnaccounted hands it to the update rule's kernel.
  struct ParamStep {
    HostParam& p;
    int index;
    const at::Tensor& grad;  // fp32, contiguous
    bool reserved;           // the state goes into the parameter's layer slab
    double lr, grad_multiplier;
    bool write_master;
    MasterDtype master_dtype = MasterDtype::kNone;
  };
  void StepAdafactor(const ParamStep& ps);
  void StepMomentum(const ParamStep& ps);  // SGD (with or without momentum) and Lion
  void StepAdamW(const ParamStep& ps);
  void AccountState(size_t index);  // after parameter `index`'s state changed
  int64_t step_ = 0;
  std::vector<at::Tensor> m_, v_, vmax_;  // per parameter index
  std::vector<int64_t> state_bytes_of_;   // per parameter index: its share of *state_bytes_
  // Shared so the optimizer stays movable; read by Stats threads.
  std::shared_ptr<std::atomic<int64_t>> state_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  // Identifies this optimizer to HostModelStore::ClaimStateReserve (stable across moves).
  std::shared_ptr<char> reserve_token_ = std::make_shared<char>(0);
};

}  // namespace rp::workers
