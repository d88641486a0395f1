// engine_metrics.h — the engine's counters as Prometheus metrics: per step the iteration's
// stats, and the engine's cumulative counters (device busy time from its timeline, bytes moved
// per transfer kind) turned into counter increments by difference with what was seen last, plus
// the memory gauges.
//
// Contract: thread-safe (one lock); the metric families outlive it.
#pragma once

#include <array>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/engine_types.h"
#include "server/metrics.h"

namespace rp::server {

class EngineMetrics {
 public:
  explicit EngineMetrics(DaemonMetrics* metrics) : metrics_(metrics) {}
  // One step's stats, and the engine's counters now (`ops`: timeline records ending after
  // seen_until(); older ones are ignored, so overlapping calls count nothing twice).
  void RecordIteration(const scheduler::IterationStats& st, const scheduler::EngineStats& es,
                       const std::vector<scheduler::OpRecord>& ops);
  double seen_until() const;

 private:
  DaemonMetrics* metrics_;
  mutable absl::Mutex mu_;
  double timeline_seen_s_ ABSL_GUARDED_BY(mu_) = 0;
  // Per device: activations up/down, parameters up, gradients down.
  std::vector<std::array<int64_t, 4>> transfer_seen_ ABSL_GUARDED_BY(mu_);
};

// roundpipe_worker_state from the engine's devices (after each step, and when an operator drains
// or enables a worker). Any thread (the gauges are atomic).
void SetWorkerStates(DaemonMetrics* metrics, const scheduler::EngineStats& es);

}  // namespace rp::server
