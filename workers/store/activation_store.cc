#include "workers/store/activation_store.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace rp::workers {

void ActivationStore::Put(ActKind kind, int layer, int microbatch, at::Tensor t, int consumers, int iteration) {
  {
    base::MutexLock lock(&mu_);
    Slot& s = slots_[{iteration, static_cast<int>(kind), layer, microbatch}];
    s.tensor = std::move(t);
    s.remaining = consumers;
    s.present = true;
    live_ += static_cast<int64_t>(s.tensor.nbytes());
    peak_ = std::max(peak_, live_);
  }
  cv_.SignalAll();
}

absl::StatusOr<at::Tensor> ActivationStore::Take(ActKind kind, int layer, int microbatch, int iteration) {
  return Take(kind, layer, microbatch, iteration, nullptr);
}

absl::StatusOr<at::Tensor> ActivationStore::Take(ActKind kind, int layer, int microbatch, int iteration,
                                                 const std::function<bool()>& cancelled) {
  const Key key{iteration, static_cast<int>(kind), layer, microbatch};
  base::MutexLock lock(&mu_);
  for (;;) {
    if (aborted_.count(iteration)) break;
    auto it = slots_.find(key);
    if (it != slots_.end() && it->second.present) break;
    if (!cancelled) {
      cv_.Wait(&mu_);
      continue;
    }
    if (cancelled()) return absl::CancelledError("the stage slot waiting for this input was abandoned");
    cv_.WaitFor(&mu_, std::chrono::milliseconds(50));  // every Put wakes it too
  }
  if (auto a = aborted_.find(iteration); a != aborted_.end()) return a->second;
  auto it = slots_.find(key);
  at::Tensor t = it->second.tensor;
  if (--it->second.remaining <= 0) {
    live_ -= static_cast<int64_t>(t.nbytes());
    slots_.erase(it);
  }
  return t;
}

void ActivationStore::Restore(ActKind kind, int layer, int microbatch, int iteration, at::Tensor t) {
  {
    base::MutexLock lock(&mu_);
    Slot& s = slots_[{iteration, static_cast<int>(kind), layer, microbatch}];
    if (s.present) {
      ++s.remaining;
    } else {
      s.tensor = std::move(t);
      s.remaining = 1;
      s.present = true;
      live_ += static_cast<int64_t>(s.tensor.nbytes());
      peak_ = std::max(peak_, live_);
    }
  }
  cv_.SignalAll();
}

void ActivationStore::Abort(absl::Status why, int iteration) {
  {
    base::MutexLock lock(&mu_);
    aborted_.emplace(iteration, why.ok() ? absl::AbortedError("aborted") : why);
  }
  cv_.SignalAll();
}

void ActivationStore::Discard(int iteration) {
  base::MutexLock lock(&mu_);
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (std::get<0>(it->first) == iteration) {
      live_ -= static_cast<int64_t>(it->second.tensor.nbytes());
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
  aborted_.erase(iteration);
}

void ActivationStore::Reset() {
  base::MutexLock lock(&mu_);
  slots_.clear();
  live_ = 0;
  aborted_.clear();
}

int64_t ActivationStore::live_bytes() const {
  base::MutexLock lock(&mu_);
  return live_;
}

int64_t ActivationStore::peak_bytes() const {
  base::MutexLock lock(&mu_);
  return peak_;
}

void ActivationStore::ResetPeak() {
  base::MutexLock lock(&mu_);
  peak_ = live_;
}

size_t ActivationStore::live_slots() const {
  base::MutexLock lock(&mu_);
  return slots_.size();
}

}  // namespace rp::workers
