#include "scheduler/runtime/profile_costs.h"

#include <algorithm>

#include "scheduler/runtime/model_adapter.h"

namespace rp::scheduler::runtime {

planning::CostModel ProfileBaseCosts(const workers::HostModelStore& store, int64_t microbatch_rows,
                                     int64_t sequence_length, int64_t head_chunk_tokens) {
  const int L = store.config().num_layers();
  planning::CostModel base;
  for (int l = 0; l < L; ++l) {
    planning::LayerCost c;
    c.kind = l == 0       ? planning::LayerKind::kEmbedding
             : l == L - 1 ? planning::LayerKind::kHead
                          : planning::LayerKind::kBlock;
    for (int id : store.layer_params(l)) {
      const workers::HostParam& p = store.param(id);
      c.param_bytes += static_cast<int64_t>(p.master.nbytes());
      if (p.trainable) c.trainable_bytes += static_cast<int64_t>(p.master.nbytes());
    }
    base.layers.push_back(c);
  }
  // Activation memory per token from the model's shape (the same estimate the simulator uses).
  const spec::ModelConfig& mc = store.config();
  planning::DeviceProfile dp;  // only the memory fields of the estimate are used
  dp.name = "measured";
  dp.peak_matmul_flops = 1e15;
  dp.memory_bandwidth = 1e12;
  dp.host_link_bandwidth = 1e10;
  planning::AnalyticOptions ao;
  ao.micro_batch_size = std::max<int64_t>(1, microbatch_rows);
  ao.sequence_length = std::max<int64_t>(1, sequence_length);
  ao.dtype_bytes = static_cast<int>(c10::elementSize(store.master_dtype()));
  ao.grad_bytes = ao.dtype_bytes;
  ao.loss_chunk_tokens = static_cast<int>(head_chunk_tokens);
  if (auto a = planning::AnalyticCostModel(mc, dp, ao); a.ok() && a->num_layers() == L) {
    base.tokens_per_microbatch = a->tokens_per_microbatch;
    base.boundary_bytes_per_token = a->boundary_bytes_per_token;
    for (int l = 0; l < L; ++l) {
      base.layers[static_cast<size_t>(l)].act_bytes_per_token = a->layers[static_cast<size_t>(l)].act_bytes_per_token;
      base.layers[static_cast<size_t>(l)].fixed_work_bytes = a->layers[static_cast<size_t>(l)].fixed_work_bytes;
    }
  }
  return base;
}

}  // namespace rp::scheduler::runtime
