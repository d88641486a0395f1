// cluster_model.h — (planning) what a cluster of K nodes gains and pays (paper §6, "Multi-node
// scaling"; docs/DAEMON.md "A cluster of daemons"): each node runs the RoundPipe schedule on its
// share of the global batch, then its gradients cross the link. The engine's exchange
// (workers/data_parallel.h) reduce-scatters every trainable fp32 gradient to its owner node and
// all-gathers the updated fp32 weights, each sending (K-1)/K of the trainable fp32 bytes per node
// (Gloo's all-to-all and all-gather); an unsharded state all-reduces instead, which sends the
// same. Sync mode adds the exchange to the node's iteration; async mode
// overlaps it with the next iteration's compute on the optimizer's thread, so the slower of the
// two sets the pace.
//
// Contract: pure functions, any thread.
#pragma once

#include <cstdint>

#include "scheduler/planning/cost_model.h"

namespace rp::planning {

struct ClusterOptions {
  int nodes = 1;
  double link_bytes_per_s = 0;  // each node's link, each direction (full duplex)
  // The share of the link's rate the exchange achieves (TCP, Gloo's rounds through the shared
  // buffer, the sums on the CPU): tests/bench/cluster_bench.sh measured 0.44-0.48 on
  // tbf-shaped 1 and 10 Gbit/s links (docs/PERF.md).
  double link_efficiency = 0.45;
  // Bytes per element of the cost model's trainable_bytes (its gradient copies: the compute dtype).
  int gradient_element_bytes = 2;
};

struct ClusterPrediction {
  int64_t trainable_elements = 0;
  int64_t wire_bytes_per_node = 0;  // sent by each node per step (received alike), sharded
  double exchange_s = 0;            // wire_bytes_per_node / link
  double sync_iteration_s = 0;      // node's sync iteration + the exchange
  double async_iteration_s = 0;     // max(node's async iteration, exchange + the node's optimizer)
};

// `node_sync_s` / `node_async_s`: one node's steady-state iteration on its share (the
// simulator's, with its optimizer time already divided by the nodes when the state is sharded);
// `node_optimizer_s`: that node's optimizer time per iteration.
ClusterPrediction PredictCluster(const CostModel& costs, const ClusterOptions& options, double node_sync_s,
                                 double node_async_s, double node_optimizer_s);

}  // namespace rp::planning
