// run_context.h — what every stage of one iteration shares: the model, the stores, the loss
// normalisation, the loss accumulator and the iteration's first error.
//
// Contract: created by the controller per iteration and shared (shared_ptr) with every stream
// operation of that iteration. Thread-safe: the accumulators and the error slot are guarded
// by one mutex; Fail() also aborts the ActivationStore so no stream waits forever.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "workers/base/mutex.h"
#include "workers/router_aux.h"
#include "workers/spec/model_config.h"
#include "workers/store/activation_store.h"
#include "workers/store/host_model_store.h"

namespace rp::workers {

struct RunContext {
  const spec::ModelConfig* cfg = nullptr;
  HostModelStore* store = nullptr;
  ActivationStore* acts = nullptr;
  int iteration = 0;
  int64_t seq_len = 0;
  // act_consumers[l]: how many stages start at layer l (Takes of kActivation(l, m)).
  std::vector<int> act_consumers;
  // Each micro-batch's loss is sum(CE) * loss_scale; loss_scale = 1 / (non-ignored tokens of the
  // whole global batch), so the micro-batch losses add up to the batch mean.
  double loss_scale = 1.0;
  // Gradients are computed for loss x grad_multiplier (the dynamic fp16 loss scale; else 1).
  double grad_multiplier = 1.0;
  int64_t head_chunk_tokens = 4096;
  // Packed documents: per micro-batch the token positions [b, s] int64 in host memory (0 where a
  // document starts; models::DocumentLayout). Empty: every row at 0..s-1, causal. Set before the
  // context is shared, read-only afterwards.
  std::vector<at::Tensor> positions;
  // Recompute fidelity (MoE models in training iterations): forward stages Put each sparse
  // block's routing (ActKind::kRouting, one consumer) and the backward stage recomputing that
  // block Takes and replays it. false: nothing is recorded and backward stages route live.
  bool replay_routing = false;
  // The router's auxiliary loss of a training iteration of an MoE model with a coefficient > 0
  // (needs replay_routing); null: off. Set before the context is shared.
  std::shared_ptr<RouterAuxTally> router_aux;

  // Generation (the controller's LastLogits): the loss stage computes no loss but each row's
  // logits at its last position, [rows, vocab] fp32 in host memory, per micro-batch. Set before
  // the context is shared.
  bool want_last_logits = false;
  void PutLastLogits(int microbatch, at::Tensor logits) {
    base::MutexLock lock(&mu_);
    last_logits_[microbatch] = std::move(logits);
  }
  std::map<int, at::Tensor> last_logits() const {
    base::MutexLock lock(&mu_);
    return last_logits_;
  }

  void AddLoss(double scaled_loss, int64_t tokens) {
    base::MutexLock lock(&mu_);
    loss_ += scaled_loss;
    tokens_ += tokens;
  }
  void Fail(const absl::Status& s) {
    {
      base::MutexLock lock(&mu_);
      if (error_.ok()) error_ = s;
    }
    if (acts) acts->Abort(s, iteration);
  }
  bool failed() const {
    base::MutexLock lock(&mu_);
    return !error_.ok();
  }
  // A copy of its own (code and message), never a second reference to the stored one: the
  // context dies on whichever stream thread drops it last, and absl's shared status is
  // reference-counted inside the system's uninstrumented absl (ThreadSanitizer cannot see it).
  absl::Status error() const {
    base::MutexLock lock(&mu_);
    return error_.ok() ? absl::OkStatus() : absl::Status(error_.code(), std::string(error_.message()));
  }
  double loss() const {
    base::MutexLock lock(&mu_);
    return loss_;
  }
  int64_t tokens() const {
    base::MutexLock lock(&mu_);
    return tokens_;
  }

 private:
  mutable base::Mutex mu_;
  double loss_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::map<int, at::Tensor> last_logits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rp::workers
