#include "scheduler/runtime/model_adapter.h"

#include "absl/strings/str_cat.h"

namespace rp::scheduler::runtime {

at::ScalarType ToScalarType(Precision p) {
  switch (p) {
    case Precision::kBFloat16:
      return at::kBFloat16;
    case Precision::kFloat16:
      return at::kHalf;
    case Precision::kFloat32:
      break;
  }
  return at::kFloat;
}

workers::AdamWOptions ToAdamW(const spec::OptimizerSpec& o) {
  workers::AdamWOptions a;
  static_cast<spec::OptimizerSpec&>(a) = o;
  return a;
}

planning::HostStateOptions HostStateOptionsFor(const JobSpec& spec, bool base_mapped) {
  planning::HostStateOptions o;
  o.master_bytes = PrecisionBytes(spec.precision);
  switch (spec.optimizer.algorithm) {
    case spec::OptimizerAlgorithm::kAdamW:
      o.moment_bytes = spec.optimizer.bf16_moments ? 4 : 8;
      break;
    case spec::OptimizerAlgorithm::kSgd:
      o.moment_bytes = spec.optimizer.momentum != 0 ? 4 : 0;
      break;
    case spec::OptimizerAlgorithm::kLion:
      o.moment_bytes = 4;
      break;
    case spec::OptimizerAlgorithm::kAdafactor:
      o.moment_bytes = 0;
      o.factored_moments = true;
      break;
  }
  o.async_grad_copy = spec.optimizer_mode == planning::OptimizerMode::kAsync;
  o.mapped_base = base_mapped && spec.model.lora.rank > 0 && !spec.hf_dir.empty();
  if (spec.data_parallel && spec.data_parallel->shard_optimizer_state) o.state_shards = spec.data_parallel->size;
  return o;
}

workers::StageTask ToStageTask(const planning::StageSlot& sl) {
  workers::StageTask t;
  t.slot = sl.index;
  t.iteration = sl.iteration;
  t.kind = sl.kind;
  t.stage = sl.stage;
  t.first_layer = sl.first_layer;
  t.num_layers = sl.num_layers;
  t.first_microbatch = sl.first_microbatch;
  t.num_microbatches = sl.num_microbatches;
  return t;
}

}  // namespace rp::scheduler::runtime
