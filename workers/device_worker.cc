#include "workers/device_worker.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <exception>

#include "absl/strings/str_cat.h"
#include "workers/device/transfer_windows.h"
#include "workers/stage_compute.h"
#include "workers/stage_state.h"

namespace rp::workers {
namespace {

using stage_internal::EnqueueWeightUpload;
using stage_internal::Guarded;
using stage_internal::Label;
using stage_internal::PlanChunks;
using stage_internal::StageState;
using stage_internal::Trains;

// Paced workers (paced_device.h) take the profile's time instead of running the math.
const Pacer* PacerOf(const StageState& s) { return s.dev->pacer(); }

bool ReplaysRouting(const StageState& s) { return s.ctx->replay_routing && s.ctx->cfg->num_experts > 0 && !PacerOf(s); }

// A backward stage's recorded routing of micro-batch m: each sparse block's record Taken from
// the activation store, its experts uploaded (the counts stay on the host).
void TakeRouting(StageState& s, int m, int mb) {
  const StageTask& sl = s.task;
  const spec::ModelConfig& cfg = *s.ctx->cfg;
  RoutingTape& tape = s.routing[static_cast<size_t>(m)];
  for (int l = std::max(1, sl.first_layer); l < sl.first_layer + sl.num_layers && l <= cfg.num_blocks; ++l) {
    if (!cfg.SparseBlock(l - 1)) continue;
    const at::Tensor packed = stage_internal::TakeInput(s, ActKind::kRouting, l, mb);
    models::RoutingDecision d = models::UnpackRouting(packed, cfg.num_experts, cfg.experts_per_token);
    d.experts = s.dev->Upload(d.experts);
    tape[l] = std::move(d);
  }
}

// Owner layers of every parameter the stage touches (consistency protocol, async mode).
std::vector<int> StageOwners(const StageTask& task) {
  std::vector<int> owners;
  if (!task.book) return owners;
  for (int l = task.first_layer; l < task.first_layer + task.num_layers; ++l) {
    for (int o : task.book->ownership().owners_used[static_cast<size_t>(l)]) {
      if (std::find(owners.begin(), owners.end(), o) == owners.end()) owners.push_back(o);
    }
  }
  return owners;
}

// The slot is done on this worker (its outputs and gradients on the host, or its iteration
// failed): the consistency counts its gradient downloads and that it finished (async mode: the
// optimizer keeps no copy of its weights for a re-run from then on, retained_weights.h), then the
// run finishes (slot_attempt.h).
// Skipped with every other operation when the device is lost: the re-run counts instead.
void CountSlot(const StageTask& task, SlotLedger& ledger) {
  ConsistencyBook* book = task.book;
  if (book == nullptr) return;
  auto ev = book->Get(task.iteration);
  const int first = task.first_layer, n = task.num_layers;
  if (Trains(task.kind)) {
    ledger.Once(SlotLedger::Effect::kCounted, 0, [&] {
      for (int l = first; l < first + n; ++l) ev->grads[static_cast<size_t>(l)]->CountDown();
    });
  }
  ledger.Once(SlotLedger::Effect::kCounted, 2, [&] {
    for (int l = first; l < first + n; ++l) ev->finished[static_cast<size_t>(l)]->CountDown();
  });
}

void FinishSlot(StageState& s) {
  if (s.attempt->abandoned()) return;
  CountSlot(s.task, s.attempt->ledger());
  s.attempt->Finish();
}

struct MicrobatchEvents {
  std::vector<EventPtr> computed, inputs_uploaded, outputs_downloaded;
};

// Micro-batch m's inputs, taken from the activation store (blocking until produced) and uploaded
// on the act-up stream. kAll: the activation (with the positions of packed documents), plus the
// labels (fused, eval) or the output gradient (backward) — every input taken first, then the
// transfers. A backward stage that recomputes ahead takes them in two steps: kCheckpoint (what
// its recompute needs), then kGradient (what only its backward needs).
enum class Inputs { kAll, kCheckpoint, kGradient };
void UploadInputs(StageState& s, int m, int mb, Inputs which) {
  const StageTask& sl = s.task;
  const size_t i = static_cast<size_t>(m);
  at::Tensor x, second;
  if (which != Inputs::kGradient) x = stage_internal::TakeInput(s, ActKind::kActivation, sl.first_layer, mb);
  if (which != Inputs::kCheckpoint) {
    if (sl.kind == spec::StageKind::kFused || sl.kind == spec::StageKind::kEval) {
      second = stage_internal::TakeInput(s, ActKind::kLabels, 0, mb);
    } else if (sl.kind == spec::StageKind::kBackward) {
      second = stage_internal::TakeInput(s, ActKind::kGradient, sl.first_layer + sl.num_layers, mb);
    }
  }
  if (which != Inputs::kGradient) {
    if (sl.kind == spec::StageKind::kBackward && ReplaysRouting(s)) TakeRouting(s, m, mb);
    s.in[i] = s.dev->Upload(x);
    if (!s.ctx->positions.empty()) s.positions[i] = s.dev->Upload(s.ctx->positions[static_cast<size_t>(mb)]);
  }
  if (which == Inputs::kCheckpoint) return;
  if (sl.kind == spec::StageKind::kFused || sl.kind == spec::StageKind::kEval) s.labels[i] = s.dev->Upload(second);
  if (sl.kind == spec::StageKind::kBackward) s.grad_out[i] = s.dev->Upload(second);
}

models::TokenLayout LayoutOf(const StageState& s, size_t i) {
  return s.positions[i].defined() ? models::DocumentLayout(s.rope, s.positions[i]) : models::TokenLayout(s.rope);
}

const RoutingTape* ReplayOf(const StageState& s, size_t i) { return ReplaysRouting(s) ? &s.routing[i] : nullptr; }

// The router's auxiliary loss: the gradient weights of micro-batch mb once its tally is complete
// (a backward stage's gradient arrives after B_1 tallied); undefined when the loss is off.
at::Tensor AuxWeights(const StageState& s, int mb) {
  if (!s.ctx->router_aux || PacerOf(s)) return at::Tensor();
  return s.ctx->router_aux->GradWeights(mb, s.device, s.ctx->grad_multiplier);
}

// A backward stage that recomputes ahead, on the compute stream: micro-batch m's recompute as
// soon as its checkpoint is up (the graph is kept in the stage), then its backward once the
// upstream gradient is.
void RecomputeMicrobatch(StageState& s, int m) {
  if (const Pacer* p = PacerOf(s)) return stage_internal::PacedRecomputeMicrobatch(s, m, *p);
  const size_t i = static_cast<size_t>(m);
  s.recomputed[i] =
      RecomputeStage(*s.ctx->cfg, s.weights, LayoutOf(s, i), s.in[i], ReplayOf(s, i), s.ctx->router_aux != nullptr);
  s.routing[i].clear();
  s.in[i] = at::Tensor();
  s.positions[i] = at::Tensor();
}
void BackwardMicrobatch(StageState& s, int m) {
  if (const Pacer* p = PacerOf(s)) return stage_internal::PacedBackwardMicrobatch(s, m, *p);
  const size_t i = static_cast<size_t>(m);
  s.grad_in[i] = BackwardFromRecompute(s.recomputed[i], s.grad_out[i], AuxWeights(s, s.task.first_microbatch + m));
  s.recomputed[i] = Recomputed();
  s.grad_out[i] = at::Tensor();
}

// The stage's math on micro-batch m; its inputs are released after. Compute stream.
void ComputeMicrobatch(StageState& s, int m) {
  if (const Pacer* p = PacerOf(s)) return stage_internal::PacedComputeMicrobatch(s, m, *p);
  const StageTask& sl = s.task;
  RunContext& ctx = *s.ctx;
  const size_t i = static_cast<size_t>(m);
  const models::TokenLayout layout = LayoutOf(s, i);
  switch (sl.kind) {
    case spec::StageKind::kForward:
      s.fwd_out[i] = ForwardStage(*ctx.cfg, s.weights, layout, s.in[i], s.task.save_inputs_of,
                                  ReplaysRouting(s) ? &s.routing[i] : nullptr);
      if (ctx.router_aux) {
        s.attempt->ledger().Once(SlotLedger::Effect::kAux, m, [&] {
          for (const auto& [layer, d] : s.routing[i]) {
            ctx.router_aux->Add(sl.first_microbatch + m, d.counts, d.prob_sum, d.experts.size(0));
          }
        });
      }
      break;
    case spec::StageKind::kFused: {
      const RouterAux aux{ctx.router_aux.get(), sl.first_microbatch + m, ctx.grad_multiplier};
      FusedResult r =
          FusedStage(*ctx.cfg, s.weights, layout, s.in[i], s.labels[i], ctx.loss_scale * ctx.grad_multiplier,
                     ctx.head_chunk_tokens, ctx.router_aux ? &aux : nullptr);
      s.attempt->ledger().Once(SlotLedger::Effect::kLoss, m,
                               [&] { ctx.AddLoss(r.loss_sum * ctx.loss_scale + r.aux_loss, r.tokens); });
      s.grad_in[i] = r.grad_input;
      break;
    }
    case spec::StageKind::kEval: {
      if (ctx.want_last_logits) {  // generation: each row's next-token logits, no loss
        s.last_logits[i] = LastLogitsStage(*ctx.cfg, s.weights, layout, s.in[i]);
        break;
      }
      const models::HeadLoss r = EvalStage(*ctx.cfg, s.weights, layout, s.in[i], s.labels[i], ctx.head_chunk_tokens);
      s.attempt->ledger().Once(SlotLedger::Effect::kLoss, m,
                               [&] { ctx.AddLoss(r.loss_sum * ctx.loss_scale, r.tokens); });
      break;
    }
    case spec::StageKind::kBackward:
      s.grad_in[i] = BackwardStage(*ctx.cfg, s.weights, layout, s.in[i], s.grad_out[i], ReplayOf(s, i),
                                   AuxWeights(s, sl.first_microbatch + m));
      s.routing[i].clear();
      break;
  }
  s.in[i] = at::Tensor();
  s.grad_out[i] = at::Tensor();
  s.labels[i] = at::Tensor();
  s.positions[i] = at::Tensor();
}

// Micro-batch m's outputs, downloaded and Put: a forward stage's activations (and the recompute
// checkpoints it saves), or a training stage's input gradient. Act-down stream.
void DownloadOutputs(StageState& s, int m, int mb) {
  const StageTask& sl = s.task;
  RunContext& ctx = *s.ctx;
  const size_t i = static_cast<size_t>(m);
  // Downloaded first, then Put together: a re-run of the slot (slot_attempt.h) Puts nothing twice.
  SlotLedger& ledger = s.attempt->ledger();
  if (sl.kind == spec::StageKind::kForward) {
    std::vector<std::pair<int, at::Tensor>> acts, routes;
    for (auto& [layer, t] : s.fwd_out[i]) acts.emplace_back(layer, s.dev->Download(t));
    for (auto& [layer, d] : s.routing[i]) {
      routes.emplace_back(layer, models::PackRouting({s.dev->Download(d.experts), d.counts, {}}));
    }
    s.fwd_out[i].clear();
    s.routing[i].clear();
    ledger.Once(SlotLedger::Effect::kOutputs, m, [&] {
      for (auto& [layer, t] : acts) {
        ctx.acts->Put(ActKind::kActivation, layer, mb, std::move(t), ctx.act_consumers[static_cast<size_t>(layer)],
                      sl.iteration);
      }
      for (auto& [layer, t] : routes) ctx.acts->Put(ActKind::kRouting, layer, mb, std::move(t), 1, sl.iteration);
    });
  } else if (sl.kind == spec::StageKind::kEval && s.last_logits[i].defined()) {
    at::Tensor logits = s.dev->Download(s.last_logits[i]);
    s.last_logits[i] = at::Tensor();
    ledger.Once(SlotLedger::Effect::kOutputs, m, [&] { ctx.PutLastLogits(mb, std::move(logits)); });
  } else if (Trains(sl.kind) && sl.first_layer > 0) {
    at::Tensor g = s.dev->Download(s.grad_in[i]);
    s.grad_in[i] = at::Tensor();
    ledger.Once(SlotLedger::Effect::kOutputs, m,
                [&] { ctx.acts->Put(ActKind::kGradient, sl.first_layer, mb, std::move(g), 1, sl.iteration); });
  }
}

// Step 2 (act-up, compute, act-down streams): per micro-batch take and upload its inputs (one
// ahead of compute), run the stage's math, download and Put its outputs; after the last one a
// training stage keeps only its weights' gradients.
MicrobatchEvents EnqueueMicrobatches(Device& dev, const std::shared_ptr<StageState>& s) {
  const StageTask& sl = s->task;
  const int mbs = sl.num_microbatches;
  const bool trains = Trains(sl.kind);
  Stream& act_up = dev.stream(StreamKind::kActivationUp);
  Stream& compute = dev.stream(StreamKind::kCompute);
  Stream& act_down = dev.stream(StreamKind::kActivationDown);
  MicrobatchEvents ev;
  ev.computed.resize(static_cast<size_t>(mbs));
  // Recompute ahead of the upstream gradient (paper's authors' rule): a backward stage's
  // micro-batch is recomputed once its checkpoint is up, and only its backward waits for the
  // gradient. The compute stream runs R(m), B(m), R(m+1), ...: at most one recomputed graph
  // waits for its gradient at a time.
  const bool ahead = sl.kind == spec::StageKind::kBackward && sl.recompute_ahead;
  for (int m = 0; m < mbs; ++m) {
    const int mb = sl.first_microbatch + m;
    // act-up: at most one micro-batch ahead of compute.
    if (m >= 2) act_up.WaitEvent(ev.computed[static_cast<size_t>(m - 2)]);
    EventPtr checkpoint_up;
    if (ahead) {
      act_up.Enqueue({Label(sl, "in ", mb), sl.iteration, sl.slot, mb}, [s, m, mb] {
        Guarded(*s, "input upload", [&] { UploadInputs(*s, m, mb, Inputs::kCheckpoint); });
      });
      checkpoint_up = MakeEvent();
      act_up.RecordEvent(checkpoint_up);
    }
    act_up.Enqueue({Label(sl, ahead ? "grad in " : "in ", mb), sl.iteration, sl.slot, mb}, [s, m, mb, ahead] {
      Guarded(*s, "input upload", [&] { UploadInputs(*s, m, mb, ahead ? Inputs::kGradient : Inputs::kAll); });
    });
    auto uploaded = MakeEvent();
    act_up.RecordEvent(uploaded);
    ev.inputs_uploaded.push_back(uploaded);

    if (ahead) {
      compute.WaitEvent(checkpoint_up);
      compute.Enqueue({Label(sl, "R ", mb), sl.iteration, sl.slot, mb},
                      [s, m] { Guarded(*s, "recompute", [&] { RecomputeMicrobatch(*s, m); }); });
      compute.WaitEvent(uploaded);
      compute.Enqueue({Label(sl, "", mb), sl.iteration, sl.slot, mb},
                      [s, m] { Guarded(*s, "backward", [&] { BackwardMicrobatch(*s, m); }); });
    } else {
      compute.WaitEvent(uploaded);
      compute.Enqueue({Label(sl, "", mb), sl.iteration, sl.slot, mb},
                      [s, m] { Guarded(*s, "compute", [&] { ComputeMicrobatch(*s, m); }); });
    }
    if (trains && m == mbs - 1) {
      // The weights are done: keep only their gradients until they are downloaded.
      compute.Enqueue({}, [s] {
        if (PacerOf(*s)) return stage_internal::PacedKeepGradients(*s);
        for (const at::Tensor& p : s->params) s->grads.push_back(p.defined() ? p.grad() : at::Tensor());
        s->params.clear();
        s->weights.layers.clear();
      });
    }
    ev.computed[static_cast<size_t>(m)] = MakeEvent();
    compute.RecordEvent(ev.computed[static_cast<size_t>(m)]);

    act_down.WaitEvent(ev.computed[static_cast<size_t>(m)]);
    act_down.Enqueue({Label(sl, "out ", mb), sl.iteration, sl.slot, mb},
                     [s, m, mb] { Guarded(*s, "output download", [&] { DownloadOutputs(*s, m, mb); }); });
    ev.outputs_downloaded.push_back(MakeEvent());
    act_down.RecordEvent(ev.outputs_downloaded.back());
  }
  return ev;
}

// Step 3 (grad-down stream), returned rather than issued: the weight gradients go down in
// chunks between the activation downloads of the stage that runs next on this worker (chunk j
// after its output j); the next Submit — or Flush, when none follows — calls it with those
// events. `done` is recorded once the outputs and the gradients are on the host.
std::function<void(const std::vector<EventPtr>&)> GradientDownload(Device& dev, const std::shared_ptr<StageState>& s,
                                                                   const std::vector<int>& owners,
                                                                   const EventPtr& last_compute, const EventPtr& done) {
  Stream& act_down = dev.stream(StreamKind::kActivationDown);
  Stream& grad_down = dev.stream(StreamKind::kGradDown);
  auto outputs = MakeEvent();
  act_down.RecordEvent(outputs);
  return [s, owners, outputs, done, last_compute, gd = &grad_down](const std::vector<EventPtr>& gates) {
    const StageTask& sl = s->task;
    gd->WaitEvent(last_compute);
    if (s->task.book && sl.iteration >= 1) {
      // Edge (4): the host gradient buffer must have been handed to the optimizer (G_cp).
      auto prev = s->task.book->Get(sl.iteration - 1);
      for (int o : owners) gd->WaitEvent(prev->gcp[static_cast<size_t>(o)]);
    }
    // Whole tensors (a gradient is accumulated on the host as one piece), LPT-packed.
    std::vector<TensorExtent> extents;
    int64_t largest = 1;
    for (int id : s->param_ids) {
      const HostParam& p = s->ctx->store->param(id);
      extents.push_back({p.name, p.trainable ? static_cast<int64_t>(p.master.nbytes()) : 0});
      largest = std::max(largest, extents.back().bytes);
    }
    auto chunks = PlanChunks(extents, static_cast<int>(gates.size()), /*no split*/ largest);
    for (size_t w = 0; w < chunks.size(); ++w) {
      if (chunks[w].empty()) continue;
      if (w < gates.size()) gd->WaitEvent(gates[w]);
      gd->Enqueue({absl::StrCat(Label(sl, "grads ", -1), " c", w), sl.iteration, sl.slot, -1},
                  [s, pieces = std::move(chunks[w])] {
                    Guarded(*s, "gradient download", [&] {
                      for (const TransferPiece& pc : pieces) {
                        const size_t k = static_cast<size_t>(pc.tensor);
                        if (k < s->grads.size() && s->grads[k].defined()) {
                          at::Tensor g = s->dev->Download(s->grads[k]);
                          s->attempt->ledger().Once(SlotLedger::Effect::kGrad, pc.tensor, [&] {
                            s->ctx->store->AccumulateGrad(s->param_ids[k], std::move(g));
                          });
                        }
                      }
                    });
                  });
    }
    gd->Enqueue({}, [s] { s->grads.clear(); });
    // The stage is done when its outputs and its gradients are on host.
    gd->WaitEvent(outputs);
    gd->Enqueue({}, [s] { FinishSlot(*s); });
    gd->RecordEvent(done);
  };
}

}  // namespace

namespace stage_internal {
void FailStage(StageState& s, const char* what, const std::exception& e) {
  const std::string where = absl::StrCat(what, " of stage slot ", s.task.slot, " (layers ", s.task.first_layer, "..",
                                         s.task.first_layer + s.task.num_layers - 1, ")");
  if (IsOutOfMemory(e)) {
    if (s.attempt->MarkOutOfMemory(absl::StrCat(where, " on ", s.dev->name(), ": ", e.what()))) return;
    s.ctx->Fail(absl::ResourceExhaustedError(
        absl::StrCat(where, " ran out of device memory on ", s.dev->name(), ": ", e.what())));
    return;
  }
  s.ctx->Fail(absl::InternalError(absl::StrCat(where, " failed: ", e.what())));
}

at::Tensor TakeInput(StageState& s, ActKind kind, int layer, int microbatch) {
  absl::StatusOr<at::Tensor> t = s.ctx->acts->Take(kind, layer, microbatch, s.task.iteration, s.attempt->cancelled());
  if (!t.ok()) throw std::runtime_error(std::string(t.status().message()));
  if (!s.attempt->Lease(s.ctx->acts, kind, layer, microbatch, s.task.iteration, *t)) {
    throw std::runtime_error("the stage slot's run was abandoned");
  }
  return *std::move(t);
}
}  // namespace stage_internal

EventPtr DeviceWorker::Submit(const StageTask& task, std::shared_ptr<RunContext> ctx,
                              std::shared_ptr<SlotAttempt> attempt) {
  auto s = std::make_shared<StageState>();
  s->task = task;
  s->ctx = std::move(ctx);
  s->attempt =
      attempt ? std::move(attempt) : std::make_shared<SlotAttempt>(std::make_shared<SlotLedger>(), &device_->health());
  s->device = device_->torch_device();
  s->dev = device_;
  const size_t mbs = static_cast<size_t>(task.num_microbatches);
  s->in.resize(mbs);
  s->grad_out.resize(mbs);
  s->labels.resize(mbs);
  s->positions.resize(mbs);
  s->recomputed.resize(mbs);
  s->routing.resize(mbs);
  s->fwd_out.resize(mbs);
  s->grad_in.resize(mbs);
  s->last_logits.resize(mbs);
  const std::vector<int> owners = StageOwners(task);

  const EventPtr params_ready = EnqueueWeightUpload(*device_, s, owners, compute_done_[0], prev_inputs_uploaded_);
  device_->stream(StreamKind::kCompute).WaitEvent(params_ready);
  MicrobatchEvents mb = EnqueueMicrobatches(*device_, s);
  compute_done_[0] = compute_done_[1];
  compute_done_[1] = mb.computed.back();
  prev_inputs_uploaded_ = std::move(mb.inputs_uploaded);

  // The previous stage's gradient download goes into this stage's windows.
  if (pending_grads_) {
    auto pending = std::move(pending_grads_);
    pending_grads_ = nullptr;
    pending(mb.outputs_downloaded);
  }
  auto done = MakeEvent();
  if (Trains(task.kind)) {
    pending_grads_ = GradientDownload(*device_, s, owners, mb.computed.back(), done);
  } else {
    Stream& act_down = device_->stream(StreamKind::kActivationDown);
    act_down.Enqueue({}, [s] {
      s->params.clear();
      s->weights.layers.clear();
      FinishSlot(*s);
    });
    act_down.RecordEvent(done);
  }
  return done;
}

void SettleSlot(const StageTask& task, SlotLedger& ledger) {
  if (task.book != nullptr) {
    auto ev = task.book->Get(task.iteration);
    ledger.Once(SlotLedger::Effect::kCounted, 1, [&] {
      for (int l = task.first_layer; l < task.first_layer + task.num_layers; ++l) {
        ev->uploads[static_cast<size_t>(l)]->CountDown();
      }
    });
  }
  CountSlot(task, ledger);
  ledger.Complete();
}

void DeviceWorker::Flush() {
  if (!pending_grads_) return;
  auto pending = std::move(pending_grads_);
  pending_grads_ = nullptr;
  pending({});
}

}  // namespace rp::workers
