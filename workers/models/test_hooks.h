// test_hooks.h — test-only switches of workers/models. First, a hook on live MoE routing: it receives the router's
// scores [T, E] (Qwen3-MoE: the fp32 softmax; GPT-OSS: the logits) and returns the scores top-k selects on (the weights
// still come from the router's own scores at the selected experts). Tests use it to make a recompute route differently
// from its forward, the way a lower-precision or another device's router could, and show that replayed routing
// (RoutingDecision) is immune. Unset (the default) it costs one relaxed atomic load per sparse block; replayed routing
// never calls it.
//
// Contract: install before starting work and clear after everything finished; the hook itself
// must be thread-safe (stages run on several threads).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>

namespace rp::workers::models {

using RouterSelectionHook = std::function<at::Tensor(const at::Tensor& probs)>;

inline std::atomic<const RouterSelectionHook*>& RouterSelectionHookSlot() {
  static std::atomic<const RouterSelectionHook*> slot{nullptr};
  return slot;
}
inline void SetRouterSelectionHookForTest(const RouterSelectionHook* hook) { RouterSelectionHookSlot().store(hook); }

// The experts' products as grouped GEMMs where usable (true, the default) or always one GEMM per
// routed expert (false): tests and benchmarks compare the two paths (expert_groups.h).
inline std::atomic<bool>& GroupedExpertGemmSlot() {
  static std::atomic<bool> on{true};
  return on;
}
inline void SetGroupedExpertGemmForTest(bool on) { GroupedExpertGemmSlot().store(on); }

}  // namespace rp::workers::models
