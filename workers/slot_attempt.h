// slot_attempt.h — a stage slot run more than once. A worker whose device is lost mid-slot leaves
// the slot half done: some micro-batches' outputs already Put, some of the loss added, some
// gradients already accumulated on the host, its inputs taken from the activation store. The
// slot is then run again on another worker from the host state, and must leave exactly what one
// run would have left:
//   SlotLedger   per (iteration, slot), shared by all its runs: which of the slot's effects on
//                shared state are done (each done once, by whichever run gets there first — the
//                math is deterministic, so both runs computed the same values), and the event
//                the controller waits on: set once one run finished the slot;
//   SlotAttempt  one run on one worker: the inputs it took (leased: given back to the activation
//                store if the run is abandoned, dropped when it finishes) and whether it was
//                abandoned (its device lost, or the run ran out of device memory).
// A slot keeps its inputs until it finished (its outputs and gradients are on the host), so a
// re-run always finds them.
//
// Contract: thread-safe. SlotLedger::Once runs its function under the ledger's lock (it may take
// the activation store's, the host store's and the run context's locks, never the ledger's).
// Exactly one of Finish and Abandon takes effect per attempt; Finish after Abandon does nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "workers/base/mutex.h"
#include "workers/device/device_health.h"
#include "workers/device/event.h"
#include "workers/store/activation_store.h"

namespace rp::workers {

class SlotLedger {
 public:
  // An effect of a stage slot on state outside it, by micro-batch or parameter index.
  enum class Effect {
    kOutputs,  // micro-batch m's outputs Put (activations, checkpoints, routing, input gradient)
    kLoss,     // micro-batch m's loss added to the run context
    kAux,      // micro-batch m's router counts added to the auxiliary-loss tally
    kGrad,     // the slot's parameter k's gradient accumulated on the host
    kCounted,  // the slot counted in the consistency protocol: 0 its gradient downloads, 1 its weight
               // uploads, 2 that it finished
  };
  // Runs `fn` unless this effect was done already by an earlier run of the slot; it counts as
  // done once `fn` returned normally.
  template <typename Fn>
  void Once(Effect what, int index, Fn&& fn) {
    base::MutexLock lock(&mu_);
    const std::pair<int, int> key{static_cast<int>(what), index};
    if (done_.count(key) != 0) return;
    fn();
    done_.insert(key);
  }
  bool Done(Effect what, int index) const;
  // The slot finished (or its iteration failed and nothing will re-run it): sets done().
  void Complete() { done_event_->Set(); }
  bool complete() const { return done_event_->IsSet(); }
  const EventPtr& done() const { return done_event_; }

 private:
  mutable base::Mutex mu_;
  std::set<std::pair<int, int>> done_ ABSL_GUARDED_BY(mu_);
  const EventPtr done_event_ = MakeEvent();
};

class SlotAttempt {
 public:
  SlotAttempt(std::shared_ptr<SlotLedger> ledger, DeviceHealth* health)
      : ledger_(std::move(ledger)), health_(health), losses_at_start_(LossesBefore(health)) {}
  SlotLedger& ledger() const { return *ledger_; }
  // A run after the first (slot_recovery.h): its weights come from RetainedWeights::Snapshot.
  bool rerun() const { return rerun_; }
  void set_rerun() { rerun_ = true; }
  const std::shared_ptr<SlotLedger>& shared_ledger() const { return ledger_; }
  DeviceHealth* health() const { return health_; }
  // Its device was lost since the run began (even if an operator restored it since).
  bool device_lost() const { return health_ != nullptr && health_->losses() != losses_at_start_; }
  // Abandoned, out of device memory, or on a device lost since it began (it will be abandoned).
  bool abandoned() const { return abandoned_.load() || out_of_memory_.load() || device_lost(); }
  // Who runs the slot again should this run fail on its own (out of device memory): set before
  // the run is submitted (slot_recovery.h); without one such a failure is the iteration's error.
  void set_on_fault(std::function<void()> on_fault) { on_fault_ = std::move(on_fault); }
  // The run ran out of device memory (`what`: the device's words): it stops like an abandoned one
  // and, returning true, is run again by whoever set on_fault (called now). False: nobody re-runs
  // it and the caller fails the iteration.
  bool MarkOutOfMemory(const std::string& what);
  bool out_of_memory() const { return out_of_memory_.load(); }
  std::string out_of_memory_what() const;
  // What Take waits with: gives up once the attempt is abandoned.
  std::function<bool()> cancelled() const {
    return [this] { return abandoned(); };
  }
  // An input this run took from `acts`. False when the run was abandoned meanwhile: the input has
  // gone back to the store at once (the re-run will take it) and the caller must stop.
  bool Lease(ActivationStore* acts, ActKind kind, int layer, int microbatch, int iteration, at::Tensor t);
  // The run will not finish (its device is lost): every input it took goes back to the store.
  // False when it had finished already (nothing to re-run).
  bool Abandon();
  // The run finished the slot: the inputs are dropped and the ledger completed. Nothing when the
  // run was abandoned.
  void Finish();

 private:
  // A run begun on a device lost already is dead from the start.
  static int64_t LossesBefore(const DeviceHealth* h) {
    if (h == nullptr) return 0;
    const int64_t n = h->losses();
    return h->lost() ? n - 1 : n;
  }
  struct Leased {
    ActivationStore* acts;
    ActKind kind;
    int layer, microbatch, iteration;
    at::Tensor tensor;
  };
  const std::shared_ptr<SlotLedger> ledger_;
  DeviceHealth* const health_;
  const int64_t losses_at_start_;
  bool rerun_ = false;              // set before the run is submitted
  std::function<void()> on_fault_;  // likewise
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> out_of_memory_{false};
  mutable base::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Leased> leases_ ABSL_GUARDED_BY(mu_);
  std::string out_of_memory_what_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rp::workers
