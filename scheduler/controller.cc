#include "scheduler/controller.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/dispatch_plan.h"
#include "workers/models/layers.h"

namespace rp::scheduler {

using planning::SlotKind;

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(ControllerOptions options,
                                                               workers::HostModelStore* store,
                                                               std::vector<workers::Device*> devices,
                                                               workers::Timeline* timeline) {
  if (store == nullptr) return absl::InvalidArgumentError("controller: no model store");
  if (devices.empty()) return absl::InvalidArgumentError("controller: no devices");
  if (absl::Status st = store->config().Validate(); !st.ok()) return st;
  const int L = store->config().num_layers();
  // Validate the partition and the round structure once, with a throw-away plan.
  planning::DispatchOptions d;
  d.num_workers = static_cast<int>(devices.size());
  d.microbatches_per_iteration = options.microbatches;
  d.microbatches_per_round = options.microbatches_per_round;
  auto plan = planning::BuildDispatchPlan(options.partition, L, d);
  if (!plan.ok()) return plan.status();
  if (options.head_chunk_tokens < 1) return absl::InvalidArgumentError("controller: head chunk must be >= 1 token");
  return std::unique_ptr<Controller>(new Controller(std::move(options), store, std::move(devices), timeline));
}

Controller::Controller(ControllerOptions options, workers::HostModelStore* store, std::vector<workers::Device*> devices,
                       workers::Timeline* timeline)
    : opt_(std::move(options)),
      store_(store),
      devices_(std::move(devices)),
      timeline_(timeline),
      adamw_(opt_.adamw),
      scaler_(opt_.loss_scaler) {
  for (workers::Device* d : devices_) workers_.push_back(std::make_unique<workers::DeviceWorker>(d));
  const int L = store_->config().num_layers();
  act_consumers_.assign(static_cast<size_t>(L + 1), 0);
  const planning::Partition& p = opt_.partition;
  int first = 0;
  for (int n : p.forward) {
    ++act_consumers_[static_cast<size_t>(first)];
    first += n;
  }
  ++act_consumers_[static_cast<size_t>(L - p.fused)];
  int top = L - p.fused;
  for (int n : p.backward) {
    top -= n;
    ++act_consumers_[static_cast<size_t>(top)];
  }
}

absl::Status Controller::ValidateBatch(const at::Tensor& tokens, const std::optional<at::Tensor>& labels) const {
  const int64_t V = store_->config().vocab;
  if (!tokens.defined() || tokens.dim() != 2) {
    return absl::InvalidArgumentError("batch: tokens must be a 2-d [batch, sequence] tensor");
  }
  if (tokens.scalar_type() != at::kLong && tokens.scalar_type() != at::kInt) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: tokens must be int32 or int64, got ", c10::toString(tokens.scalar_type())));
  }
  const int64_t B = tokens.size(0), S = tokens.size(1);
  if (B == 0 || S == 0) return absl::InvalidArgumentError("batch: empty batch");
  if (B % opt_.microbatches != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: ", B, " sequences cannot be split into ", opt_.microbatches, " equal micro-batches"));
  }
  const int64_t lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
  if (lo < 0 || hi >= V) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: token ids must lie in [0, ", V, "), found [", lo, ", ", hi, "]"));
  }
  if (labels) {
    if (!labels->defined() || labels->sizes() != tokens.sizes()) {
      return absl::InvalidArgumentError("batch: labels must have the shape of tokens");
    }
    if (labels->scalar_type() != at::kLong && labels->scalar_type() != at::kInt) {
      return absl::InvalidArgumentError("batch: labels must be int32 or int64");
    }
    at::Tensor l = labels->to(at::kLong);
    at::Tensor bad = l.ne(workers::models::kIgnoreIndex).logical_and(l.lt(0).logical_or(l.ge(V)));
    if (bad.any().item<bool>()) {
      return absl::InvalidArgumentError(absl::StrCat("batch: labels must be -100 or lie in [0, ", V, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<IterationStats> Controller::RunIteration(const at::Tensor& tokens_in,
                                                        const std::optional<at::Tensor>& labels_in) {
  if (absl::Status st = ValidateBatch(tokens_in, labels_in); !st.ok()) return st;
  const auto t0 = std::chrono::steady_clock::now();
  const double tl0 = timeline_ ? timeline_->Now() : 0;
  const workers::models::TransformerConfig& cfg = store_->config();
  const int L = cfg.num_layers();
  const int M = opt_.microbatches;
  at::Tensor tokens = tokens_in.to(at::kLong).contiguous();
  at::Tensor labels = labels_in ? labels_in->to(at::kLong).contiguous() : workers::models::ShiftLabels(tokens);
  const int64_t valid = labels.ne(workers::models::kIgnoreIndex).sum().item<int64_t>();
  if (valid == 0) return absl::InvalidArgumentError("batch: no token has a label to train on");

  auto ctx = std::make_shared<workers::RunContext>();
  ctx->cfg = &cfg;
  ctx->store = store_;
  ctx->acts = &acts_;
  ctx->iteration = iteration_;
  ctx->seq_len = tokens.size(1);
  ctx->act_consumers = act_consumers_;
  ctx->loss_scale = 1.0 / static_cast<double>(valid);
  ctx->head_chunk_tokens = opt_.head_chunk_tokens;
  ctx->grad_multiplier = scaler_.scale();

  acts_.Reset();
  acts_.ResetPeak();
  const int64_t per = tokens.size(0) / M;
  for (int m = 0; m < M; ++m) {
    acts_.Put(workers::ActKind::kActivation, 0, m, tokens.narrow(0, m * per, per).clone(), act_consumers_[0],
              iteration_);
    acts_.Put(workers::ActKind::kLabels, 0, m, labels.narrow(0, m * per, per).clone(), 1, iteration_);
  }

  planning::DispatchOptions d;
  d.num_workers = static_cast<int>(workers_.size());
  d.microbatches_per_iteration = M;
  d.microbatches_per_round = opt_.microbatches_per_round;
  d.g0 = next_g0_;
  d.mode = planning::OptimizerMode::kSync;
  auto plan = planning::BuildDispatchPlan(opt_.partition, L, d);
  if (!plan.ok()) return plan.status();
  next_g0_ = plan->next_g0;

  // Backward stages' first layers: the forward stages must checkpoint their inputs.
  std::vector<int> bwd_starts;
  for (const planning::StageSlot& s : plan->slots) {
    if (s.kind == SlotKind::kBackward && s.round == 0) bwd_starts.push_back(s.first_layer);
  }
  std::vector<workers::EventPtr> done;
  for (planning::StageSlot s : plan->slots) {
    s.iteration = iteration_;
    workers::StageTask task{s, {}};
    if (s.kind == SlotKind::kForward) {
      for (int l : bwd_starts) {
        if (l > s.first_layer && l < s.first_layer + s.num_layers) task.save_inputs_of.push_back(l);
      }
    }
    done.push_back(workers_[static_cast<size_t>(s.worker)]->Submit(task, ctx));
  }
  for (const auto& e : done) e->Wait();

  IterationStats st;
  st.iteration = iteration_;
  st.activation_peak_bytes = acts_.peak_bytes();
  if (absl::Status err = ctx->error(); !err.ok()) {
    store_->ZeroGrads();
    acts_.Reset();
    return err;
  }
  st.loss_scale = scaler_.scale();
  st.lr = opt_.lr_schedule.At(opt_.adamw.lr, adamw_.steps() + 1);
  if (scaler_.enabled()) {
    const double scaled_norm = workers::AdamW::GradNorm(*store_);
    if (!scaler_.Update(std::isfinite(scaled_norm))) {
      st.skipped_step = true;
      st.grad_norm = scaled_norm / st.loss_scale;
    }
  }
  if (!st.skipped_step) {
    auto norm = adamw_.Step(*store_, st.lr, st.loss_scale);
    if (!norm.ok()) {
      store_->ZeroGrads();
      return norm.status();
    }
    st.grad_norm = *norm;
  }
  store_->ZeroGrads();
  st.loss = ctx->loss();
  st.tokens = ctx->tokens();
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  st.worker_busy_s.assign(workers_.size(), 0);
  if (timeline_) {
    double first = 1e300, last = 0;
    for (const workers::TimelineEntry& e : timeline_->Entries()) {
      if (e.iteration != iteration_ || e.start_s < tl0 || e.stream != "compute") continue;
      st.worker_busy_s[static_cast<size_t>(e.worker)] += e.end_s - e.start_s;
      first = std::min(first, e.start_s);
      last = std::max(last, e.end_s);
    }
    double busy = 0;
    for (double b : st.worker_busy_s) busy += b;
    if (last > first) st.bubble_ratio = 1 - busy / (static_cast<double>(workers_.size()) * (last - first));
  }
  ++iteration_;
  return st;
}

}  // namespace rp::scheduler
