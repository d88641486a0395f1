#include "workers/optimizer_worker.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "workers/device/test_hooks.h"
#include "workers/optim/step_policy.h"

namespace rp::workers {

OptimizerWorker::OptimizerWorker(HostModelStore* store, ConsistencyBook* book, AdamWOptions adamw,
                                 LossScalerOptions scaler, DataParallelGroup* data_parallel)
    : store_(store), book_(book), data_parallel_(data_parallel), adamw_(adamw), scaler_(scaler), thread_([this] {
        Loop();
      }) {}

OptimizerWorker::~OptimizerWorker() {
  {
    base::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void OptimizerWorker::Enqueue(StepRequest r) {
  {
    base::MutexLock lock(&mu_);
    queue_.push_back(std::move(r));
  }
  cv_.SignalAll();
}

StepResult OptimizerWorker::AwaitStep(int iteration) {
  base::MutexLock lock(&mu_);
  while (results_.count(iteration) == 0) cv_.Wait(&mu_);
  StepResult r = results_[iteration];
  results_.erase(iteration);
  return r;
}

void OptimizerWorker::WaitIdle() {
  base::MutexLock lock(&mu_);
  while (!queue_.empty() || busy_) cv_.Wait(&mu_);
}

double OptimizerWorker::loss_scale() const {
  base::MutexLock lock(&mu_);
  return scaler_.scale();
}

void OptimizerWorker::Loop() {
  for (;;) {
    StepRequest r;
    {
      base::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      r = queue_.front();
      queue_.pop_front();
      busy_ = true;
    }
    Process(r);
    {
      base::MutexLock lock(&mu_);
      busy_ = false;
    }
    cv_.SignalAll();
  }
}

void OptimizerWorker::Process(const StepRequest& r) {
  auto ev = book_->Get(r.iteration);
  auto next = book_->Get(r.iteration + 1);
  GradientCopy copy = CopyGradients(r, *ev);
  const bool apply = Step(r, copy);
  CopyParameters(r, apply, *ev, *next);
}

OptimizerWorker::GradientCopy OptimizerWorker::CopyGradients(const StepRequest& r, IterationEvents& ev) {
  const OwnershipMap& own = book_->ownership();
  const int L = static_cast<int>(own.owned_params.size());
  // G_cp, deepest layer first (gradients land from the top of the model down). Data parallel:
  // each layer's gradients summed over the nodes once copied (the iteration's loss and tokens
  // first: every micro-batch's loss is known once the deepest layer's gradients landed).
  GradientCopy out;
  for (int o = L - 1; o >= 0; --o) {
    if (own.owned_params[static_cast<size_t>(o)].empty()) continue;
    for (int l : own.user_layers[static_cast<size_t>(o)]) ev.grads[static_cast<size_t>(l)]->event()->Wait();
    MaybeDelayForTest();
    const std::vector<int>& params = own.owned_params[static_cast<size_t>(o)];
    std::vector<at::Tensor> layer_grads;
    for (int i : params) {
      HostParam& p = store_->param(i);
      if (!p.trainable) continue;
      if (!p.opt_grad.defined()) store_->AllocateOptimizerGrad(p);
      p.opt_grad.copy_(p.grad);
      p.grad.zero_();
      layer_grads.push_back(p.opt_grad);
    }
    ev.gcp[static_cast<size_t>(o)]->Set();
    const bool sharded = data_parallel_ != nullptr && data_parallel_->sharded();
    if (data_parallel_ != nullptr && out.reduced.ok()) {
      if (!out.node_sums) {
        auto sums = SumNodeStats(*data_parallel_, *r.ctx);
        if (sums.ok()) {
          out.node_sums = *sums;
        } else {
          out.reduced = sums.status();
        }
      }
      // Sharded: each node receives the sums of the parameters it steps (and counts their squares).
      if (out.reduced.ok()) {
        out.reduced = sharded ? ReduceGradsToOwners(
                                    *data_parallel_, *store_, params,
                                    [this](int i) { return store_->param(i).opt_grad; }, &out.sq)
                              : data_parallel_->SumTensors(layer_grads);
      }
    }
    if (!store_->pacer() && !sharded) {
      for (const at::Tensor& g : layer_grads) out.sq += std::pow(at::norm(g, 2, at::kDouble).item<double>(), 2);
    }
  }
  // The global norm: every node's squares of what it owns, summed.
  if (data_parallel_ != nullptr && data_parallel_->sharded() && out.reduced.ok()) {
    auto sq = SumSquaresOverNodes(*data_parallel_, out.sq);
    if (sq.ok()) {
      out.sq = *sq;
    } else {
      out.reduced = sq.status();
    }
  }
  return out;
}

bool OptimizerWorker::Step(const StepRequest& r, const GradientCopy& copy) {
  // The same policy as the synchronous step (workers/optim/step_policy.h).
  StepDecision d;
  {
    base::MutexLock lock(&mu_);
    d = DecideStep(std::sqrt(copy.sq), r.loss_scale, adamw_.options().max_grad_norm, &scaler_);
  }
  StepResult res;
  res.grad_norm = d.grad_norm;
  res.node_sums = copy.node_sums;
  const bool apply = d.apply && !r.ctx->failed() && copy.reduced.ok();
  if (!r.ctx->failed() && !d.status.ok()) {
    res.status = absl::Status(d.status.code(), absl::StrCat("iteration ", r.iteration, ": ", d.status.message()));
  }
  if (!copy.reduced.ok()) {
    res.status =
        absl::Status(copy.reduced.code(), absl::StrCat("iteration ", r.iteration, ": ", copy.reduced.message()));
  }
  res.skipped = !apply;
  if (apply) {
    MaybeDelayOptimizerForTest();
    const auto t0 = std::chrono::steady_clock::now();
    adamw_.BeginStep();
    for (int i = 0; i < store_->num_params(); ++i) {
      HostParam& p = store_->param(i);
      // A sharded optimizer state (data parallel): only the owned parameters; P_cp shares them.
      if (p.trainable && (data_parallel_ == nullptr || data_parallel_->Owns(i))) {
        adamw_.StepParam(*store_, i, p.opt_grad, r.lr, d.multiplier);
      }
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  {
    base::MutexLock lock(&mu_);
    results_[r.iteration] = res;
  }
  cv_.SignalAll();
  return apply;
}

void OptimizerWorker::CopyParameters(const StepRequest& r, bool apply, IterationEvents& ev, IterationEvents& next) {
  const OwnershipMap& own = book_->ownership();
  const int L = static_cast<int>(own.owned_params.size());
  // P_cp, shallowest layer first: the next-but-one iteration needs layer 0 first. A sharded
  // state's owners share the layer's stepped fp32 copies first (the same order on every node).
  absl::Status shared = absl::OkStatus();
  for (int o = 0; o < L; ++o) {
    if (own.owned_params[static_cast<size_t>(o)].empty()) continue;
    if (apply && data_parallel_ != nullptr && data_parallel_->sharded() && shared.ok()) {
      shared = ShareStepped(*store_, *data_parallel_, own.owned_params[static_cast<size_t>(o)]);
      // The step was reported already; the group is gone now, so the next iteration's first
      // collective fails the job (nothing runs long on weights that were not shared).
      if (!shared.ok()) {
        r.ctx->Fail(absl::Status(shared.code(), absl::StrCat("iteration ", r.iteration, ": ", shared.message())));
      }
    }
    for (int l : own.user_layers[static_cast<size_t>(o)]) next.uploads[static_cast<size_t>(l)]->event()->Wait();
    MaybeDelayForTest();
    if (apply) {
      // A slot of the next iteration still running may be re-run (a lost worker): keep what it saw.
      bool keep = false;
      for (int l : own.user_layers[static_cast<size_t>(o)])
        keep |= !next.finished[static_cast<size_t>(l)]->event()->IsSet();
      book_->retained().Overwrite(*store_, own.owned_params[static_cast<size_t>(o)], r.iteration + 1, keep);
    }
    ev.pcp[static_cast<size_t>(o)]->Set();
  }
}

}  // namespace rp::workers

namespace rp::workers {

int64_t OptimizerWorker::good_steps() const {
  base::MutexLock lock(&mu_);
  return scaler_.good_steps();
}

void OptimizerWorker::Restore(const AdamWState& s, double loss_scale, int64_t good_steps) {
  base::MutexLock lock(&mu_);
  adamw_.set_state(s);
  scaler_.Restore(loss_scale, good_steps);
}

}  // namespace rp::workers
