#include "workers/spec/optimizer_spec.h"

#include <algorithm>
#include <cmath>

namespace rp::spec {

const char* OptimizerName(OptimizerAlgorithm a) {
  switch (a) {
    case OptimizerAlgorithm::kSgd:
      return "sgd";
    case OptimizerAlgorithm::kLion:
      return "lion";
    case OptimizerAlgorithm::kAdafactor:
      return "adafactor";
    case OptimizerAlgorithm::kAdamW:
      break;
  }
  return "adamw";
}

double LrSchedule::At(double base_lr, int64_t step) const {
  if (kind == Kind::kConstant) return base_lr;
  if (warmup_steps > 0 && step <= warmup_steps) {
    return base_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  const int64_t decay = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay));
  const double min_lr = base_lr * min_lr_ratio;
  return min_lr + (base_lr - min_lr) * 0.5 * (1 + std::cos(M_PI * progress));
}

}  // namespace rp::spec
