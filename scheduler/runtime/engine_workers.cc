// Engine::Impl: the pool's workers taken out and put back by an operator (Engine::DrainWorker,
// EnableWorker). The devices' health (workers/device/device_health.h) is the one state: every
// job's controller plans its next iteration over the usable workers, and a worker drained at once
// is lost to them (its slots re-run elsewhere, scheduler/runtime/slot_recovery.h).
#include "absl/strings/str_cat.h"
#include "scheduler/runtime/engine_impl.h"

namespace rp::scheduler {

namespace {
absl::Status CheckWorker(int worker, size_t count) {
  if (worker < 0 || static_cast<size_t>(worker) >= count) {
    return absl::OutOfRangeError(
        absl::StrCat("no worker ", worker, ": this engine has workers 0..", static_cast<int>(count) - 1));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status Engine::Impl::DrainWorker(int worker, bool now) {
  if (absl::Status st = CheckWorker(worker, devices_.size()); !st.ok()) return st;
  base::MutexLock lock(&workers_mu_);  // two drains at once never leave the pool empty
  workers::DeviceHealth& h = devices_[static_cast<size_t>(worker)]->health();
  if (h.lost()) return absl::OkStatus();  // out already
  if (!now && h.drained()) return absl::OkStatus();
  int others = 0;
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (static_cast<int>(d) != worker && devices_[d]->health().usable()) ++others;
  }
  if (others == 0) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker, " (",
                                                      devices_[static_cast<size_t>(worker)]->name(),
                                                      ") is the last usable one in the pool: enable another first"));
  }
  if (now) {
    h.MarkLost(absl::UnavailableError(
        absl::StrCat(devices_[static_cast<size_t>(worker)]->name(), " drained at once by an operator")));
  } else {
    h.SetDrained(true);
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::EnableWorker(int worker) {
  if (absl::Status st = CheckWorker(worker, devices_.size()); !st.ok()) return st;
  base::MutexLock lock(&workers_mu_);
  workers::DeviceHealth& h = devices_[static_cast<size_t>(worker)]->health();
  h.SetDrained(false);
  h.Restore();
  return absl::OkStatus();
}

}  // namespace rp::scheduler
