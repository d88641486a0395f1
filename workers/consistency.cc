#include "workers/consistency.h"

namespace rp::workers {

ConsistencyBook::ConsistencyBook(OwnershipMap ownership, std::vector<int> uploads_per_layer,
                                 std::vector<int> grads_per_layer)
    : own_(std::move(ownership)), uploads_(std::move(uploads_per_layer)), grads_(std::move(grads_per_layer)) {}

std::shared_ptr<IterationEvents> ConsistencyBook::Get(int iteration) {
  base::MutexLock lock(&mu_);
  auto& slot = by_iteration_[iteration];
  if (!slot) {
    slot = std::make_shared<IterationEvents>();
    const size_t L = uploads_.size();
    for (size_t l = 0; l < L; ++l) {
      slot->uploads.push_back(std::make_unique<CountdownEvent>(uploads_[l]));
      slot->grads.push_back(std::make_unique<CountdownEvent>(grads_[l]));
      slot->finished.push_back(std::make_unique<CountdownEvent>(uploads_[l]));
      slot->gcp.push_back(MakeEvent());
      slot->pcp.push_back(MakeEvent());
      if (own_.owned_params[l].empty()) {  // nothing to copy: never wait on it
        slot->gcp.back()->Set();
        slot->pcp.back()->Set();
      }
    }
  }
  return slot;
}

void ConsistencyBook::ReleaseUploads(int iteration) {
  auto ev = Get(iteration);
  // finished first: an optimizer's P_cp let through by the uploads then keeps no copy for a
  // re-run that will never come.
  for (auto& f : ev->finished) f->Release();
  for (auto& u : ev->uploads) u->Release();
}

void ConsistencyBook::SetCounts(std::vector<int> uploads_per_layer, std::vector<int> grads_per_layer, int reset_from) {
  base::MutexLock lock(&mu_);
  uploads_ = std::move(uploads_per_layer);
  grads_ = std::move(grads_per_layer);
  by_iteration_.erase(by_iteration_.lower_bound(reset_from), by_iteration_.end());
}

void ConsistencyBook::PruneBefore(int iteration) {
  base::MutexLock lock(&mu_);
  by_iteration_.erase(by_iteration_.begin(), by_iteration_.lower_bound(iteration));
}

}  // namespace rp::workers
