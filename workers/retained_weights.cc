#include "workers/retained_weights.h"

#include <ATen/ATen.h>

namespace rp::workers {

void RetainedWeights::Overwrite(HostModelStore& store, const std::vector<int>& params, int next_iteration, bool keep) {
  base::MutexLock lock(&mu_);
  for (int i : params) {
    HostParam& p = store.param(i);
    if (!p.trainable) continue;
    if (keep && kept_.count({next_iteration, i}) == 0) {
      at::Tensor old = p.master.clone();
      bytes_ += static_cast<int64_t>(old.nbytes());
      kept_.emplace(std::make_pair(next_iteration, i), std::move(old));
    }
    p.master.copy_(p.fp32);
  }
}

at::Tensor RetainedWeights::Snapshot(const HostModelStore& store, int param, int iteration) {
  base::MutexLock lock(&mu_);
  if (auto it = kept_.find({iteration, param}); it != kept_.end()) return it->second;
  return store.param(param).master.clone();
}

void RetainedWeights::DropThrough(int iteration) {
  base::MutexLock lock(&mu_);
  for (auto it = kept_.begin(); it != kept_.end() && it->first.first <= iteration;) {
    bytes_ -= static_cast<int64_t>(it->second.nbytes());
    it = kept_.erase(it);
  }
}

int64_t RetainedWeights::bytes() const {
  base::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace rp::workers
