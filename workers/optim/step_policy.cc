#include "workers/optim/step_policy.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace rp::workers {

StepDecision DecideStep(double scaled_norm, double loss_scale, double max_grad_norm, LossScaler* scaler) {
  StepDecision d;
  d.grad_norm = scaled_norm / loss_scale;
  const bool finite = std::isfinite(d.grad_norm);
  if (scaler != nullptr && scaler->enabled()) {
    d.apply = scaler->Update(finite);
  } else {
    d.apply = finite;
    if (!finite) {
      d.status = absl::FailedPreconditionError(
          absl::StrCat("optimizer: gradient norm is ", d.grad_norm,
                       " (training diverged, or the model holds non-finite weights); step skipped"));
    }
  }
  d.multiplier = 1.0 / loss_scale;
  if (d.apply && max_grad_norm > 0 && d.grad_norm > max_grad_norm) d.multiplier *= max_grad_norm / (d.grad_norm + 1e-6);
  return d;
}

}  // namespace rp::workers
