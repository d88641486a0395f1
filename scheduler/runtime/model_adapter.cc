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

workers::AdamWOptions ToAdamW(const OptimizerSpec& o) {
  workers::AdamWOptions a;
  a.lr = o.lr;
  a.beta1 = o.beta1;
  a.beta2 = o.beta2;
  a.eps = o.eps;
  a.weight_decay = o.weight_decay;
  a.max_grad_norm = o.max_grad_norm;
  a.bf16_moments = o.bf16_moments;
  a.algorithm = o.algorithm == OptimizerSpec::Algorithm::kSgd         ? workers::OptimizerAlgorithm::kSgd
                : o.algorithm == OptimizerSpec::Algorithm::kLion      ? workers::OptimizerAlgorithm::kLion
                : o.algorithm == OptimizerSpec::Algorithm::kAdafactor ? workers::OptimizerAlgorithm::kAdafactor
                                                                      : workers::OptimizerAlgorithm::kAdamW;
  a.beta2_decay = o.beta2_decay;
  a.eps1 = o.eps1;
  a.eps2 = o.eps2;
  a.clip_threshold = o.clip_threshold;
  a.momentum = o.momentum;
  a.dampening = o.dampening;
  a.nesterov = o.nesterov;
  return a;
}

std::string OptimizerName(OptimizerSpec::Algorithm a) {
  switch (a) {
    case OptimizerSpec::Algorithm::kSgd:
      return "sgd";
    case OptimizerSpec::Algorithm::kLion:
      return "lion";
    case OptimizerSpec::Algorithm::kAdafactor:
      return "adafactor";
    case OptimizerSpec::Algorithm::kAdamW:
      break;
  }
  return "adamw";
}

workers::LrSchedule ToLrSchedule(const LrScheduleSpec& s) {
  workers::LrSchedule l;
  l.kind = s.kind == LrScheduleSpec::Kind::kWarmupCosine ? workers::LrSchedule::Kind::kWarmupCosine
                                                         : workers::LrSchedule::Kind::kConstant;
  l.warmup_steps = s.warmup_steps;
  l.total_steps = s.total_steps;
  l.min_lr_ratio = s.min_lr_ratio;
  return l;
}

planning::HostStateOptions HostStateOptionsFor(const JobSpec& spec, bool base_mapped) {
  planning::HostStateOptions o;
  o.master_bytes = PrecisionBytes(spec.precision);
  switch (spec.optimizer.algorithm) {
    case OptimizerSpec::Algorithm::kAdamW:
      o.moment_bytes = spec.optimizer.bf16_moments ? 4 : 8;
      break;
    case OptimizerSpec::Algorithm::kSgd:
      o.moment_bytes = spec.optimizer.momentum != 0 ? 4 : 0;
      break;
    case OptimizerSpec::Algorithm::kLion:
      o.moment_bytes = 4;
      break;
    case OptimizerSpec::Algorithm::kAdafactor:
      o.moment_bytes = 0;
      o.factored_moments = true;
      break;
  }
  o.async_grad_copy = spec.optimizer_mode == planning::OptimizerMode::kAsync;
  o.mapped_base = base_mapped && spec.model.lora.rank > 0 && !spec.hf_dir.empty();
  return o;
}

workers::StageTask ToStageTask(const planning::StageSlot& sl) {
  workers::StageTask t;
  t.slot = sl.index;
  t.iteration = sl.iteration;
  t.kind = sl.kind == planning::SlotKind::kForward ? workers::StageKind::kForward
           : sl.kind == planning::SlotKind::kFused ? workers::StageKind::kFused
                                                   : workers::StageKind::kBackward;
  t.stage = sl.stage;
  t.first_layer = sl.first_layer;
  t.num_layers = sl.num_layers;
  t.first_microbatch = sl.first_microbatch;
  t.num_microbatches = sl.num_microbatches;
  return t;
}

}  // namespace rp::scheduler::runtime
