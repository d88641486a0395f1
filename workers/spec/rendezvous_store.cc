// The in-process rendezvous store (rendezvous_store.h).
#include "workers/spec/rendezvous_store.h"

#include "absl/strings/str_cat.h"

namespace rp::spec {

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

size_t InMemoryStore::ErasePrefix(const std::string& prefix) {
  base::MutexLock lock(&mu_);
  size_t erased = 0;
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    it = values_.erase(it);
    ++erased;
  }
  return erased;
}

size_t InMemoryStore::size() const {
  base::MutexLock lock(&mu_);
  return values_.size();
}

}  // namespace rp::spec
