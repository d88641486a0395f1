// loss_scaler.h — dynamic loss scaling for fp16 training: gradients are computed for
// loss x scale; a step whose gradients contain inf/NaN is skipped and the scale backs off;
// after `growth_interval` good steps in a row the scale grows.
//
// Contract: a small value type, not thread-safe; the controller owns one per job and consults
// it between iterations (sync mode). Disabled (scale 1, never skips) unless enabled.
#pragma once

#include <cstdint>

namespace rp::workers {

struct LossScalerOptions {
  bool enabled = false;
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions o = {}) : opt_(o), scale_(o.enabled ? o.init_scale : 1.0) {}
  double scale() const { return scale_; }
  bool enabled() const { return opt_.enabled; }
  // Reports whether the iteration's gradients were finite; returns true when the optimizer
  // step may run (always true when disabled and finite).
  bool Update(bool grads_finite) {
    if (!opt_.enabled) return grads_finite;
    if (!grads_finite) {
      scale_ = scale_ * opt_.backoff_factor < opt_.min_scale ? opt_.min_scale : scale_ * opt_.backoff_factor;
      good_steps_ = 0;
      ++skipped_;
      return false;
    }
    if (++good_steps_ >= opt_.growth_interval) {
      scale_ *= opt_.growth_factor;
      good_steps_ = 0;
    }
    return true;
  }
  int64_t skipped_steps() const { return skipped_; }
  int64_t good_steps() const { return good_steps_; }
  // Restores a checkpointed scaler (scale and the run of good steps since the last change).
  void Restore(double scale, int64_t good_steps) {
    if (opt_.enabled) scale_ = scale;
    good_steps_ = good_steps;
  }

 private:
  LossScalerOptions opt_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace rp::workers
