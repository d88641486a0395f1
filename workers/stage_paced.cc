// The paced backend's stage math (stage_state.h): the profile's time, data-free results.
#include <ATen/ATen.h>

#include "workers/stage_state.h"

namespace rp::workers::stage_internal {
namespace {

// A boundary activation (or its gradient) of micro-batch m: [rows, sequence, hidden], no data.
at::Tensor Boundary(const StageState& s, const at::Tensor& like) {
  return at::empty({like.size(0), like.size(1), s.ctx->cfg->hidden},
                   at::TensorOptions().dtype(s.ctx->store->master_dtype()).device(c10::kMeta));
}

PacedCompute KindOf(spec::StageKind k) {
  switch (k) {
    case spec::StageKind::kForward:
    case spec::StageKind::kEval:
      return PacedCompute::kForward;
    case spec::StageKind::kFused:
      return PacedCompute::kFused;
    case spec::StageKind::kBackward:
      return PacedCompute::kBackward;
  }
  return PacedCompute::kForward;
}

}  // namespace

void PacedComputeMicrobatch(StageState& s, int m, const Pacer& pacer) {
  const StageTask& sl = s.task;
  const size_t i = static_cast<size_t>(m);
  pacer.Spend(pacer.ComputeSeconds(KindOf(sl.kind), sl.first_layer, sl.num_layers));
  switch (sl.kind) {
    case spec::StageKind::kForward:
      for (int l : sl.save_inputs_of) s.fwd_out[i].push_back({l, Boundary(s, s.in[i])});
      s.fwd_out[i].push_back({sl.first_layer + sl.num_layers, Boundary(s, s.in[i])});
      break;
    case spec::StageKind::kFused:
      s.attempt->ledger().Once(SlotLedger::Effect::kLoss, m, [&] { s.ctx->AddLoss(0, s.labels[i].numel()); });
      if (sl.first_layer > 0) s.grad_in[i] = Boundary(s, s.in[i]);
      break;
    case spec::StageKind::kEval:
      s.attempt->ledger().Once(SlotLedger::Effect::kLoss, m, [&] { s.ctx->AddLoss(0, s.labels[i].numel()); });
      break;
    case spec::StageKind::kBackward:
      s.grad_in[i] = Boundary(s, s.grad_out[i]);
      break;
  }
  s.in[i] = at::Tensor();
  s.grad_out[i] = at::Tensor();
  s.labels[i] = at::Tensor();
  s.positions[i] = at::Tensor();
}

void PacedRecomputeMicrobatch(StageState& s, int m, const Pacer& pacer) {
  const size_t i = static_cast<size_t>(m);
  pacer.Spend(pacer.ComputeSeconds(PacedCompute::kRecompute, s.task.first_layer, s.task.num_layers));
  s.in[i] = at::Tensor();
  s.positions[i] = at::Tensor();
}

void PacedBackwardMicrobatch(StageState& s, int m, const Pacer& pacer) {
  const size_t i = static_cast<size_t>(m);
  pacer.Spend(pacer.ComputeSeconds(PacedCompute::kBackwardAfterRecompute, s.task.first_layer, s.task.num_layers));
  s.grad_in[i] = Boundary(s, s.grad_out[i]);
  s.grad_out[i] = at::Tensor();
}

void PacedKeepGradients(StageState& s) {
  for (size_t k = 0; k < s.params.size(); ++k) {
    const bool trains = s.ctx->store->param(s.param_ids[k]).trainable;
    s.grads.push_back(trains ? at::empty_like(s.params[k], s.params[k].options().device(c10::kMeta)) : at::Tensor());
  }
  s.params.clear();
  s.weights.layers.clear();
}

}  // namespace rp::workers::stage_internal
