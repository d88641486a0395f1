// step_policy.h — the one optimizer-step policy of both modes (sync: the controller after the
// iteration; async: the OptimizerWorker, layer by layer): from the global norm of the
// loss-scaled gradients decide whether the step applies — fp16: the loss scaler's overflow rule
// (skip and back off); otherwise a non-finite norm is an error — and the multiplier every
// gradient gets (unscale, times the clip factor when the norm exceeds max_grad_norm).
//
// Contract: pure apart from updating `scaler` (the caller serialises access to it).
#pragma once

#include "absl/status/status.h"
#include "workers/optim/loss_scaler.h"

namespace rp::workers {

struct StepDecision {
  double grad_norm = 0;   // unscaled, before clipping
  bool apply = false;     // false: the step is skipped (fp16 overflow) or failed (status)
  double multiplier = 1;  // for every gradient: 1 / loss_scale x clip
  absl::Status status;    // FailedPrecondition: non-finite gradients without a loss scaler
};

// `scaler` may be null or disabled (no fp16 loss scaling).
StepDecision DecideStep(double scaled_norm, double loss_scale, double max_grad_norm, LossScaler* scaler);

}  // namespace rp::workers
