// retained_weights.h — the weights an unfinished stage slot may still need, kept when the async
// optimizer overwrites them. In async mode (consistency.h) P_cp(T-1) writes the weights stepped
// with iteration T-1's gradients once every slot of iteration T uploaded its copy (edge 1). A
// slot of T whose worker is lost after that upload is run again (slot_attempt.h) and must upload
// the same weights, the ones stepped with T-2's — which P_cp(T-1) may have overwritten. So P_cp
// keeps a copy of what it overwrites while some slot of T using it has not finished, and a re-run
// uploads its iteration's version: that copy, or (not yet overwritten) a copy of the masters taken
// under the same lock. Normal runs never read from here; the copies cost host memory only for the
// layers of slots still running when their weights are stepped (about the stages in flight).
//
// Contract: thread-safe. Overwrite is the optimizer's (one thread); Snapshot any worker's;
// DropThrough the controller's, once an iteration's slots all finished.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <utility>
#include <vector>

#include "workers/base/mutex.h"
#include "workers/store/host_model_store.h"

namespace rp::workers {

class RetainedWeights {
 public:
  // P_cp: master = fp32 for `params` (trainable ones), keeping the old master for a re-run of a
  // slot of `next_iteration` when `keep` (some slot of it using them has not finished).
  void Overwrite(HostModelStore& store, const std::vector<int>& params, int next_iteration, bool keep);
  // What a re-run of a slot of `iteration` uploads for parameter `param`: the weights that
  // iteration's runs saw (a private copy).
  at::Tensor Snapshot(const HostModelStore& store, int param, int iteration);
  // Every slot of iterations <= `iteration` finished: their copies go.
  void DropThrough(int iteration);
  int64_t bytes() const;

 private:
  mutable base::Mutex mu_;
  std::map<std::pair<int, int>, at::Tensor> kept_ ABSL_GUARDED_BY(mu_);  // (iteration, param) -> master
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rp::workers
