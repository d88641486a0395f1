// The in-process rendezvous store (rendezvous_store.h).
#include "workers/collective/rendezvous_store.h"

#include "absl/strings/str_cat.h"

namespace rp::workers::collective {

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  base::MutexLock lock(&mu_);
  if (values_.size() >= kMaxKeys && values_.count(key) == 0) {
    return absl::ResourceExhaustedError("the rendezvous store is full");
  }
  values_[key] = value;
  cv_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key, std::chrono::steady_clock::time_point deadline) {
  base::MutexLock lock(&mu_);
  for (;;) {
    if (auto it = values_.find(key); it != values_.end()) return it->second;
    if (std::chrono::steady_clock::now() >= deadline || !cv_.WaitUntil(&mu_, deadline)) {
      if (auto it = values_.find(key); it != values_.end()) return it->second;
      return absl::DeadlineExceededError(absl::StrCat("rendezvous: no peer published '", key, "' in time"));
    }
  }
}

}  // namespace rp::workers::collective
