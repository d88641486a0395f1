// The cost of a cluster's gradient exchange (cluster_model.h).
#include "scheduler/planning/cluster_model.h"

#include <algorithm>

namespace rp::planning {

ClusterPrediction PredictCluster(const CostModel& costs, const ClusterOptions& o, double node_sync_s,
                                 double node_async_s, double node_optimizer_s) {
  ClusterPrediction p;
  int64_t trainable_bytes = 0;
  for (const LayerCost& l : costs.layers) trainable_bytes += l.trainable_bytes;
  p.trainable_elements = trainable_bytes / std::max(1, o.gradient_element_bytes);
  const int k = std::max(1, o.nodes);
  // Reduce-scatter then all-gather, each (K-1)/K of the fp32 bytes.
  p.wire_bytes_per_node = 2 * (k - 1) * p.trainable_elements * 4 / k;
  const double rate = o.link_bytes_per_s * o.link_efficiency;
  p.exchange_s = rate > 0 ? static_cast<double>(p.wire_bytes_per_node) / rate : 0;
  p.sync_iteration_s = node_sync_s + p.exchange_s;
  p.async_iteration_s = std::max(node_async_s, p.exchange_s + node_optimizer_s);
  return p;
}

}  // namespace rp::planning
