// metrics.h — the daemon's Prometheus metric families (ARCHITECTURE §5): prefix roundpipe_, base
// units, _total on counters, low-cardinality labels (worker, stream, direction, kind, pool,
// state, node; never a job id). One registry is created in main and passed in; nothing is global.
//
// Contract: prometheus-cpp metrics are thread-safe; DaemonMetrics only adds label lookups that
// are safe from any thread (prometheus Family::Add is internally locked).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>
#include <vector>

namespace rp::server {

class DaemonMetrics {
 public:
  explicit DaemonMetrics(prometheus::Registry& registry);

  // Every family name this class registers (the golden list the integration test checks).
  static std::vector<std::string> FamilyNames();

  prometheus::Counter& tokens_trained;
  prometheus::Counter& iterations;
  prometheus::Histogram& iteration_duration;
  prometheus::Histogram& optimizer_step;
  prometheus::Gauge& loss;
  prometheus::Gauge& eval_loss;
  prometheus::Counter& evaluations;
  prometheus::Gauge& learning_rate;
  prometheus::Gauge& grad_norm;
  prometheus::Gauge& bubble_ratio;
  prometheus::Counter& batches_received;
  prometheus::Counter& batches_rejected;
  prometheus::Counter& checkpoint_failures;
  prometheus::Counter& collective_seconds;  // cluster jobs: this node's time inside collectives
  prometheus::Counter& collective_bytes;    // and the fp32 bytes it put into them
  // On a cluster job's coordinator, every node as it last reported: {node}.
  prometheus::Family<prometheus::Gauge>& cluster_node_tokens_per_second;
  prometheus::Family<prometheus::Gauge>& cluster_node_bubble_ratio;
  prometheus::Family<prometheus::Gauge>& cluster_node_collective_bytes;
  prometheus::Family<prometheus::Counter>& worker_busy;     // {worker, stream}
  prometheus::Family<prometheus::Counter>& transfer_bytes;  // {direction, kind}
  prometheus::Family<prometheus::Gauge>& host_memory;       // {pool}
  prometheus::Family<prometheus::Gauge>& device_memory;     // {device}
  prometheus::Family<prometheus::Gauge>& worker_state;      // {device, state}: 1 for its state, else 0
  prometheus::Family<prometheus::Gauge>& jobs;              // {state}
  prometheus::Family<prometheus::Gauge>& build_info;        // {version, torch}
  prometheus::Family<prometheus::Counter>& rpc_requests;    // {method, code}
  prometheus::Family<prometheus::Histogram>& rpc_duration;  // {method}
};

}  // namespace rp::server
