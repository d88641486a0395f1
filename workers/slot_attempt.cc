#include "workers/slot_attempt.h"

namespace rp::workers {

bool SlotLedger::Done(Effect what, int index) const {
  base::MutexLock lock(&mu_);
  return done_.count({static_cast<int>(what), index}) != 0;
}

bool SlotAttempt::Lease(ActivationStore* acts, ActKind kind, int layer, int microbatch, int iteration, at::Tensor t) {
  base::MutexLock lock(&mu_);
  if (abandoned_.load()) {
    acts->Restore(kind, layer, microbatch, iteration, std::move(t));
    return false;
  }
  leases_.push_back({acts, kind, layer, microbatch, iteration, std::move(t)});
  return true;
}

bool SlotAttempt::Abandon() {
  std::vector<Leased> back;
  {
    base::MutexLock lock(&mu_);
    if (finished_ || abandoned_.load()) return false;
    abandoned_.store(true);
    back.swap(leases_);
  }
  for (Leased& l : back) l.acts->Restore(l.kind, l.layer, l.microbatch, l.iteration, std::move(l.tensor));
  return true;
}

void SlotAttempt::Finish() {
  std::vector<Leased> drop;
  {
    base::MutexLock lock(&mu_);
    if (abandoned_.load() || out_of_memory_.load() || finished_) return;
    finished_ = true;
    drop.swap(leases_);
  }
  ledger_->Complete();
}

bool SlotAttempt::MarkOutOfMemory(const std::string& what) {
  if (!on_fault_) return false;
  {
    base::MutexLock lock(&mu_);
    if (finished_ || out_of_memory_.load()) return true;
    out_of_memory_what_ = what;
    out_of_memory_.store(true);
  }
  on_fault_();
  return true;
}

std::string SlotAttempt::out_of_memory_what() const {
  base::MutexLock lock(&mu_);
  return out_of_memory_what_;
}

}  // namespace rp::workers
