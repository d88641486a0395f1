// growing_layers.h — the small cost model the pool and lost-worker simulator tests share: L
// layers whose forward, backward and fused times grow with the layer index (so stages differ),
// 4000 bytes of weights and gradients each, with boundary activations for the transfer cases.
//
// Contract: header-only test support; a pure function.
#pragma once

#include "scheduler/planning/cost_model.h"

namespace rp::planning {

inline CostModel GrowingLayers(int L) {
  CostModel c;
  for (int l = 0; l < L; ++l) {
    LayerCost x;
    x.fwd_s = 1.0 + 0.1 * l;
    x.bwd_s = 2.5 + 0.2 * l;
    x.fused_s = 3.0 + 0.3 * l;
    x.param_bytes = 4000;
    x.trainable_bytes = 4000;
    c.layers.push_back(x);
  }
  c.tokens_per_microbatch = 10;
  c.boundary_bytes_per_token = 10;
  return c;
}

}  // namespace rp::planning
