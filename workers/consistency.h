// consistency.h — the layerwise model consistency protocol (paper §4.3) as per-layer events.
//
// For every iteration T and layer l:
//   uploads[T][l]  counts down the weight uploads of layer l by iteration T (every slot that
//                  touches l, in every round: forward, fused and backward recompute uploads);
//   grads[T][l]    counts down the gradient downloads of layer l by iteration T;
//   gcp[T][o]      set by the optimizer after G_cp of the parameters owned by layer o;
//   pcp[T][o]      set by the optimizer after P_cp (fp32 -> master) of those parameters,
//                  i.e. once the weights stepped with iteration T's gradients are uploadable;
//   finished[T][l] counts down the slots of iteration T touching layer l as they finish (outputs
//                  and gradients on the host): until then a lost worker may make one of them
//                  run again, so P_cp keeps what it overwrites (retained_weights.h).
// A parameter is owned by the lowest layer that uses it (a tied embedding/head weight belongs
// to layer 0). The four edges:
//   (1) P_cp(T, o) waits uploads[T+1][l] for every layer l using o's parameters;
//   (2) an upload of layer l in iteration T waits pcp[T-2][o] for the owners o of its params;
//   (3) G_cp(T, o) waits grads[T][l] for every layer l using o's parameters;
//   (4) a gradient download of layer l in iteration T waits gcp[T-1][o] likewise.
// (5) holds because one optimizer thread runs G_cp, the step and P_cp of iteration T strictly
// before those of T+1. No global barrier anywhere.
//
// Contract: ConsistencyBook is thread-safe; event sets are created on first use and pruned by
// the controller once no stage or optimizer step can reference them.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <vector>

#include "workers/base/check.h"
#include "workers/base/mutex.h"
#include "workers/device/event.h"
#include "workers/retained_weights.h"

namespace rp::workers {

class CountdownEvent {
 public:
  explicit CountdownEvent(int count) : left_(count), event_(MakeEvent()) {
    if (count <= 0) event_->Set();
  }
  void CountDown() {
    const int before = left_.fetch_sub(1);
    RP_CHECK(before >= 1) << "consistency event counted down past zero (" << before - 1
                          << "): the dispatch plan's per-layer counts are wrong";
    if (before == 1) event_->Set();
  }
  // Sets the event whatever the count (no more producers will come).
  void Release() { event_->Set(); }
  const EventPtr& event() const { return event_; }

 private:
  std::atomic<int> left_;
  EventPtr event_;
};

struct IterationEvents {
  std::vector<std::unique_ptr<CountdownEvent>> uploads, grads, finished;  // per layer
  std::vector<EventPtr> gcp, pcp;                                         // per layer (set at once for non-owners)
};

// Which parameters each layer owns and which layers use each owner's parameters.
struct OwnershipMap {
  std::vector<std::vector<int>> owned_params;  // per layer: parameter indices it owns
  std::vector<std::vector<int>> owners_used;   // per layer: owner layers of the params it uses
  std::vector<std::vector<int>> user_layers;   // per owner layer: layers using its params
};

class ConsistencyBook {
 public:
  // `uploads_per_layer[l]` / `grads_per_layer[l]`: how many uploads / gradient downloads of
  // layer l one iteration performs (from the dispatch plan).
  ConsistencyBook(OwnershipMap ownership, std::vector<int> uploads_per_layer, std::vector<int> grads_per_layer);
  std::shared_ptr<IterationEvents> Get(int iteration);
  // Releases uploads[iteration][*] and finished[iteration][*]: no such iteration will run (end of
  // training / drain).
  void ReleaseUploads(int iteration);
  void PruneBefore(int iteration);
  // New per-layer counts (a new partition), used by event sets created from now on; `reset_from`
  // drops already created sets of that iteration and later (nobody may wait on them yet).
  void SetCounts(std::vector<int> uploads_per_layer, std::vector<int> grads_per_layer, int reset_from);
  const OwnershipMap& ownership() const { return own_; }
  RetainedWeights& retained() { return retained_; }

 private:
  OwnershipMap own_;
  RetainedWeights retained_;
  base::Mutex mu_;
  std::vector<int> uploads_ ABSL_GUARDED_BY(mu_), grads_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<IterationEvents>> by_iteration_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rp::workers
