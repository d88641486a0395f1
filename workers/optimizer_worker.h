// optimizer_worker.h — the asynchronous CPU optimizer (paper §3.2 "Supporting asynchronous
// optimizer", §4.3): a host thread that owns the fp32 optimizer copy and, per iteration T, in
// this order (constraint 5):
//   G_cp  for each owner layer, deepest first: wait until every gradient download of its
//         parameters in T landed (edge 3), move the master gradient buffer into the optimizer's
//         own copy and zero the buffer, then signal gcp[T] (edge 4 lets T+1 write again);
//   step  global-norm clipping over the whole model (the norm is exact: it is taken after all of
//         T's gradients landed, which costs nothing because T+1 runs on older weights anyway),
//         fp16 loss-scale check, AdamW on the fp32 copy;
//   P_cp  for each owner layer, shallowest first: wait until iteration T+1 finished every upload
//         of its parameters (edge 1), copy fp32 -> master, signal pcp[T] (edge 2 lets T+2 upload).
// Staleness 1: iteration T+1 computes on the weights stepped with T-1's gradients while this
// thread applies T's.
//
// Contract: Enqueue is called by the controller in iteration order; AwaitStep from any thread.
// The loss scaler lives here (one-update lag: the scale used by T+1 was chosen before T's
// overflow check — the same lag the paper's design implies). Destruction drains the queue
// only after Finish released the uploads of the iteration that will never run.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "absl/status/statusor.h"
#include "workers/base/mutex.h"
#include "workers/consistency.h"
#include "workers/data_parallel.h"
#include "workers/optim/adamw.h"
#include "workers/optim/loss_scaler.h"
#include "workers/run_context.h"
#include "workers/store/host_model_store.h"

namespace rp::workers {

struct StepRequest {
  int iteration = 0;
  std::shared_ptr<RunContext> ctx;  // to learn whether the iteration failed
  double lr = 0;
  double loss_scale = 1;  // the scale T's gradients were computed with
};

struct StepResult {
  double grad_norm = 0;  // unscaled, before clipping
  bool skipped = false;  // failed iteration or fp16 overflow: weights unchanged
  double seconds = 0;    // wall time of the step math (AdamW over every parameter)
  absl::Status status;   // non-OK when the gradients were not finite without loss scaling
  // Data parallel: the iteration's loss and labelled tokens over every node.
  std::optional<NodeSums> node_sums;
};

class OptimizerWorker {
 public:
  // `data_parallel` (optional, outliving this): each layer's gradients are summed over the nodes
  // as they are copied (G_cp), before the norm and the step, so the reduction of layer l
  // overlaps the downloads of the layers below it and the next iteration's compute.
  OptimizerWorker(HostModelStore* store, ConsistencyBook* book, AdamWOptions adamw, LossScalerOptions scaler,
                  DataParallelGroup* data_parallel = nullptr);
  ~OptimizerWorker();
  void Enqueue(StepRequest r);
  // Blocks until iteration T's step math ran (P_cp may still wait for T+1's uploads).
  StepResult AwaitStep(int iteration);
  // Blocks until every queued request finished, P_cp included.
  void WaitIdle();
  double loss_scale() const;
  // Checkpoints: the optimizer's state; call only when idle (after WaitIdle, nothing queued).
  AdamWState adamw_state() const { return adamw_.state(); }
  int64_t state_bytes() const { return adamw_.StateBytes(); }  // any thread
  int64_t good_steps() const;
  void Restore(const AdamWState& s, double loss_scale, int64_t good_steps);

 private:
  void Loop();
  // One iteration's G_cp, step and P_cp (the header's order).
  void Process(const StepRequest& r);
  struct GradientCopy {
    double sq = 0;                            // the squared norm of the copied gradients
    std::optional<NodeSums> node_sums;        // data parallel: summed over the nodes
    absl::Status reduced = absl::OkStatus();  // data parallel: the sums' outcome
  };
  GradientCopy CopyGradients(const StepRequest& r, IterationEvents& ev);
  // Decides, applies (or skips) and reports the step; true when it was applied.
  bool Step(const StepRequest& r, const GradientCopy& copy);
  void CopyParameters(const StepRequest& r, bool apply, IterationEvents& ev, IterationEvents& next);

  HostModelStore* store_;
  ConsistencyBook* book_;
  DataParallelGroup* data_parallel_;
  AdamW adamw_;
  mutable base::Mutex mu_;
  base::CondVar cv_;
  std::deque<StepRequest> queue_ ABSL_GUARDED_BY(mu_);
  std::map<int, StepResult> results_ ABSL_GUARDED_BY(mu_);
  LossScaler scaler_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rp::workers
