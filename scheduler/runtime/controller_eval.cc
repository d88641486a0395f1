// Controller: an evaluation pass — the training plan's forward slots and B_1 (as an eval stage
// that sums the loss, no backward), between iterations, with the weights flushed.
#include <ATen/ATen.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/model_adapter.h"
#include "workers/models/layers.h"

namespace rp::scheduler {

using runtime::ToStageTask;
using spec::StageKind;

absl::StatusOr<EvalResult> Controller::Evaluate(const at::Tensor& tokens_in, const std::optional<at::Tensor>& labels_in,
                                                const std::optional<at::Tensor>& positions_in) {
  if (!inflight_.empty()) {
    return absl::FailedPreconditionError("controller: await every submitted iteration before an evaluation");
  }
  if (absl::Status st = Flush(); !st.ok()) return st;  // async: the weights hold every step
  auto host = ToHostMicrobatches(tokens_in, labels_in, positions_in, /*training=*/false);
  if (!host.ok()) return host.status();
  if (host->valid == 0) return EvalResult{};  // nothing to evaluate in this batch
  const auto start = std::chrono::steady_clock::now();
  auto ctx = ForwardPass(std::move(*host), tokens_in.size(1), /*last_logits=*/false);
  if (!ctx.ok()) return ctx.status();
  EvalResult r;
  r.loss_sum = (*ctx)->loss();
  r.tokens = (*ctx)->tokens();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

absl::StatusOr<at::Tensor> Controller::LastLogits(const at::Tensor& tokens_in,
                                                  const std::optional<at::Tensor>& positions_in) {
  if (!inflight_.empty()) {
    return absl::FailedPreconditionError("controller: await every submitted iteration before generating");
  }
  if (absl::Status st = Flush(); !st.ok()) return st;
  // No label counts: every target ignored (the pass computes logits, not a loss).
  const at::Tensor labels = at::full(tokens_in.sizes(), workers::models::kIgnoreIndex, at::kLong);
  auto host = ToHostMicrobatches(tokens_in, labels, positions_in, /*training=*/false);
  if (!host.ok()) return host.status();
  auto ctx = ForwardPass(std::move(*host), tokens_in.size(1), /*last_logits=*/true);
  if (!ctx.ok()) return ctx.status();
  std::vector<at::Tensor> rows;
  for (auto& [mb, logits] : (*ctx)->last_logits()) rows.push_back(logits);
  if (static_cast<int>(rows.size()) != opt_.microbatches) {
    return absl::InternalError("controller: a generation pass lost a micro-batch's logits");
  }
  return at::cat(rows, 0);  // micro-batches in order: the map is sorted by micro-batch
}

absl::StatusOr<std::shared_ptr<workers::RunContext>> Controller::ForwardPass(HostBatch host, int64_t seq_len,
                                                                             bool last_logits) {
  const int L = store_->config().num_layers();
  const int M = opt_.microbatches;
  const int E = -2 - evaluations_++;  // an iteration id of its own: never a training iteration's
  auto ctx = std::make_shared<workers::RunContext>();
  ctx->cfg = &store_->config();
  ctx->store = store_;
  ctx->acts = &acts_;
  ctx->iteration = E;
  ctx->seq_len = seq_len;
  ctx->positions = std::move(host.positions);
  ctx->loss_scale = 1.0;  // sums, not means: the caller averages over a whole validation set
  ctx->head_chunk_tokens = opt_.head_chunk_tokens;
  ctx->want_last_logits = last_logits;
  // Who takes layer l's input: the forward stages that start there and the loss stage.
  ctx->act_consumers.assign(static_cast<size_t>(L + 1), 0);
  int first = 0;
  for (int n : opt_.partition.forward) {
    ++ctx->act_consumers[static_cast<size_t>(first)];
    first += n;
  }
  ++ctx->act_consumers[static_cast<size_t>(L - opt_.partition.fused)];
  for (int m = 0; m < M; ++m) {
    acts_.Put(workers::ActKind::kActivation, 0, m, std::move(host.tokens[m]), ctx->act_consumers[0], E);
    acts_.Put(workers::ActKind::kLabels, 0, m, std::move(host.labels[m]), 1, E);
  }
  // The training plan's forward slots and B_1's, on the workers the round-robin continues with.
  const std::vector<int> usable = recovery_->Usable();
  if (usable.empty()) return absl::UnavailableError("controller: every worker of the job is lost or drained");
  planning::DispatchOptions d;
  d.num_workers = static_cast<int>(usable.size());
  d.microbatches_per_iteration = M;
  d.microbatches_per_round = opt_.microbatches_per_round;
  d.g0 = next_g0_ % d.num_workers;
  d.mode = planning::OptimizerMode::kSync;
  auto plan = planning::BuildDispatchPlan(opt_.partition, L, d);
  if (!plan.ok()) return plan.status();
  std::vector<workers::EventPtr> done;
  for (planning::StageSlot sl : plan->slots) {
    if (sl.kind == spec::StageKind::kBackward) continue;
    sl.iteration = E;
    workers::StageTask task = ToStageTask(sl);
    if (sl.kind == spec::StageKind::kFused) task.kind = spec::StageKind::kEval;
    done.push_back(recovery_->Submit(usable[static_cast<size_t>(sl.worker)], task, ctx));
  }
  for (auto& w : workers_) w->Flush();
  if (recovery_->Usable().size() != usable.size()) recovery_->Poke();
  for (const auto& e : done) e->Wait();
  recovery_->Forget(E);
  if (absl::Status err = ctx->error(); !err.ok()) {
    acts_.Discard(E);
    return err;
  }
  return ctx;
}

}  // namespace rp::scheduler
