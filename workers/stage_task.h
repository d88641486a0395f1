// stage_task.h — what a device worker needs to run one stage slot: which layers, which
// micro-batches, which kind of stage, and (async mode) the consistency events to honour. The
// controller translates the planner's StageSlot into this; the data plane never sees the plan.
//
// Contract: a plain value type.
#pragma once

#include <vector>

#include "workers/consistency.h"
#include "workers/spec/stage_kind.h"

namespace rp::workers {

struct StageTask {
  int slot = 0;  // the slot's index in the iteration's dispatch plan (timeline records carry it)
  int iteration = 0;
  spec::StageKind kind = spec::StageKind::kForward;  // kEval: B_1 without autograd (stage_kind.h)
  int stage = 0;  // forward: 1..Sf (F_i); fused and eval: 1 (B_1); backward: 2..Sb (B_j)
  int first_layer = 0;
  int num_layers = 0;
  int first_microbatch = 0;  // global index within the iteration
  int num_microbatches = 0;
  std::vector<int> save_inputs_of;  // forward: layers whose input becomes a checkpoint
  // Backward: recompute each micro-batch as soon as its checkpoint is on the device; only the
  // backward proper waits for the upstream gradient. false: both wait for every input.
  bool recompute_ahead = true;
  // Async mode only (null in sync mode): the layerwise consistency events (consistency.h) this
  // stage waits on before uploading weights / downloading gradients, and counts down after.
  ConsistencyBook* book = nullptr;
};

}  // namespace rp::workers
