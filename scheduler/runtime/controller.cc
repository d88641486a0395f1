#include "scheduler/runtime/controller.h"

#include "scheduler/runtime/model_adapter.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/partition.h"
#include "workers/device/test_hooks.h"
#include "workers/models/layers.h"
#include "workers/optim/step_policy.h"
#include "workers/spec/model_config.h"

namespace rp::scheduler {

using runtime::ToStageTask;

using spec::StageKind;

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(ControllerOptions options,
                                                               workers::HostModelStore* store,
                                                               std::vector<workers::Device*> devices,
                                                               workers::Timeline* timeline) {
  if (store == nullptr) return absl::InvalidArgumentError("controller: no model store");
  if (devices.empty()) return absl::InvalidArgumentError("controller: no devices");
  if (absl::Status st = ValidateOptions(options, store->config(), static_cast<int>(devices.size())); !st.ok()) {
    return st;
  }
  return std::unique_ptr<Controller>(new Controller(std::move(options), store, std::move(devices), timeline));
}

absl::Status Controller::ValidateOptions(const ControllerOptions& options, const spec::ModelConfig& cfg,
                                         int num_workers) {
  if (absl::Status st = cfg.Validate(); !st.ok()) return st;
  const int L = cfg.num_layers();
  // Validate the partition and the round structure once, with a throw-away plan.
  planning::DispatchOptions d;
  d.num_workers = num_workers;
  d.microbatches_per_iteration = options.microbatches;
  d.microbatches_per_round = options.microbatches_per_round;
  planning::Partition check = options.partition;
  if (options.auto_partition) {  // starts with one layer per stage slot
    check = planning::Partition{std::vector<int>(static_cast<size_t>(L - 1), 1), 1,
                                std::vector<int>(static_cast<size_t>(L - 1), 1)};
    if (options.profile_iterations < 2) {
      return absl::InvalidArgumentError("controller: automatic partitioning needs profile_iterations >= 2");
    }
  }
  if (options.min_stages < 0 || options.min_stages > 2 * L - 1) {
    return absl::InvalidArgumentError(absl::StrCat("controller: min_stages ", options.min_stages, " is outside 0..",
                                                   2 * L - 1, " (", L, " layers make at most ", 2 * L - 1,
                                                   " stage slots)"));
  }
  if (options.t_max_window != 0 && !(options.t_max_window >= 1 && std::isfinite(options.t_max_window))) {
    return absl::InvalidArgumentError("controller: t_max_window must be >= 1 (or 0: no window)");
  }
  if ((options.min_stages > 0 || options.t_max_window > 0) && !options.auto_partition) {
    return absl::InvalidArgumentError("controller: min_stages and t_max_window steer the automatic partition only");
  }
  if (options.choose_round_size &&
      (!options.auto_partition || !options.partition_by_simulation || options.microbatches_per_round != 0)) {
    return absl::InvalidArgumentError(
        "controller: choosing the round size needs the simulated automatic partition and no fixed round size");
  }
  auto plan = planning::BuildDispatchPlan(check, L, d);
  if (!plan.ok()) return plan.status();
  if (options.head_chunk_tokens < 1) return absl::InvalidArgumentError("controller: head chunk must be >= 1 token");
  return absl::OkStatus();
}

namespace {
// The optimizer's own thread count when the job leaves it to us: every core in sync mode (the
// step runs after the iteration), the cores beside one per device worker in async mode.
ControllerOptions WithOptimizerThreads(ControllerOptions o, size_t devices) {
  if (o.adamw.threads <= 0) {
    o.adamw.threads =
        workers::OptimizerThreads::DefaultSize(o.mode == planning::OptimizerMode::kAsync, static_cast<int>(devices));
  }
  return o;
}
}  // namespace

Controller::Controller(ControllerOptions options, workers::HostModelStore* store, std::vector<workers::Device*> devices,
                       workers::Timeline* timeline)
    : opt_(WithOptimizerThreads(std::move(options), devices.size())),
      store_(store),
      devices_(std::move(devices)),
      timeline_(timeline),
      adamw_(opt_.adamw),
      scaler_(opt_.loss_scaler) {
  std::vector<workers::DeviceWorker*> raw;
  for (workers::Device* d : devices_) {
    workers_.push_back(std::make_unique<workers::DeviceWorker>(d));
    raw.push_back(workers_.back().get());
  }
  recovery_ = std::make_unique<runtime::SlotRecovery>(std::move(raw), opt_.timeline_job);
  if (opt_.resume_adamw) {
    adamw_.set_state(*opt_.resume_adamw);
    scaler_.Restore(opt_.resume_loss_scale > 0 ? opt_.resume_loss_scale : scaler_.scale(), opt_.resume_good_steps);
  }
  const int L = store_->config().num_layers();
  if (opt_.auto_partition) {
    // Profiling partition: one layer per stage slot (the head alone in B_1).
    planning::Partition prof;
    prof.fused = 1;
    prof.forward.assign(static_cast<size_t>(L - 1), 1);
    prof.backward.assign(static_cast<size_t>(L - 1), 1);
    opt_.partition = prof;
    profile_ = std::make_unique<planning::MeasuredProfile>(L, 0.9, /*skip_first=*/1);
  }
  if (opt_.mode == planning::OptimizerMode::kAsync) {
    // Parameter ownership (lowest using layer).
    workers::OwnershipMap own;
    own.owned_params.resize(static_cast<size_t>(L));
    own.owners_used.resize(static_cast<size_t>(L));
    own.user_layers.resize(static_cast<size_t>(L));
    std::map<int, int> owner;
    for (int l = 0; l < L; ++l) {
      for (int id : store_->layer_params(l)) {
        if (!owner.count(id)) {
          owner[id] = l;
          own.owned_params[static_cast<size_t>(l)].push_back(id);
        }
        const int o = owner[id];
        auto& used = own.owners_used[static_cast<size_t>(l)];
        if (std::find(used.begin(), used.end(), o) == used.end()) used.push_back(o);
        auto& users = own.user_layers[static_cast<size_t>(o)];
        if (std::find(users.begin(), users.end(), l) == users.end()) users.push_back(l);
      }
    }
    book_ = std::make_unique<workers::ConsistencyBook>(std::move(own), std::vector<int>(static_cast<size_t>(L), 0),
                                                       std::vector<int>(static_cast<size_t>(L), 0));
    optimizer_ = std::make_unique<workers::OptimizerWorker>(store_, book_.get(), opt_.adamw, opt_.loss_scaler,
                                                            opt_.data_parallel.get());
    if (opt_.resume_adamw) {
      optimizer_->Restore(*opt_.resume_adamw,
                          opt_.resume_loss_scale > 0 ? opt_.resume_loss_scale : optimizer_->loss_scale(),
                          opt_.resume_good_steps);
    }
  }
  ApplyPartition(opt_.partition);
  last_usable_ = recovery_->Usable();
  plan_workers_ = static_cast<int>(workers_.size());
}

Controller::~Controller() {
  // Let every stage finish and release the optimizer's last P_cp wait before its thread joins.
  for (auto& [it, f] : inflight_) {
    for (const auto& e : f.done) e->Wait();
  }
  if (book_) book_->ReleaseUploads(iteration_);
  if (optimizer_) optimizer_->WaitIdle();
}

absl::StatusOr<IterationStats> Controller::RunIteration(const at::Tensor& tokens,
                                                        const std::optional<at::Tensor>& labels,
                                                        const std::optional<at::Tensor>& positions) {
  auto it = SubmitIteration(tokens, labels, positions);
  if (!it.ok()) return it.status();
  return AwaitIteration(*it);
}

void Controller::ApplyPlannedPartition() {
  if (!planned_) return;
  const int round = opt_.choose_round_size ? planned_->microbatches_per_round : opt_.microbatches_per_round;
  if (planned_->partition == opt_.partition && round == opt_.microbatches_per_round) return;
  if (opt_.mode == planning::OptimizerMode::kAsync) {
    // A new partition changes the per-layer event counts: drain once (a Flush-like point), so
    // no optimizer step still waits on an event set built with the old counts.
    for (auto& [it, g] : inflight_) {
      for (const auto& e : g.done) e->Wait();
      workers::StepResult step = optimizer_->AwaitStep(it);
      g.drained_step = step;
    }
    book_->ReleaseUploads(iteration_);
    optimizer_->WaitIdle();
  }
  opt_.microbatches_per_round = round;  // ApplyPartition counts the uploads per round
  ApplyPartition(planned_->partition);
}

std::shared_ptr<workers::RunContext> Controller::MakeRunContext(int T, int64_t seq_len, int64_t valid,
                                                                std::vector<at::Tensor> positions) {
  const spec::ModelConfig& cfg = store_->config();
  const int M = opt_.microbatches;
  auto ctx = std::make_shared<workers::RunContext>();
  ctx->cfg = &cfg;
  ctx->store = store_;
  ctx->acts = &acts_;
  ctx->iteration = T;
  ctx->seq_len = seq_len;
  ctx->positions = std::move(positions);
  ctx->replay_routing = true;
  if (cfg.router_aux_loss_coef > 0) {
    int sparse = 0;
    for (int b = 0; b < cfg.num_blocks; ++b) sparse += cfg.SparseBlock(b) ? 1 : 0;
    if (sparse > 0) {
      ctx->router_aux = std::make_shared<workers::RouterAuxTally>(M, cfg.num_experts, sparse,
                                                                  cfg.router_aux_loss_coef / static_cast<double>(M));
    }
  }
  ctx->act_consumers = act_consumers_;
  ctx->loss_scale = 1.0 / static_cast<double>(valid);
  ctx->head_chunk_tokens = opt_.head_chunk_tokens;
  return ctx;
}

absl::Status Controller::DispatchIteration(int T, InFlight& f) {
  const bool async = opt_.mode == planning::OptimizerMode::kAsync;
  // Planned over the workers still usable: a lost one's slots went to the others (re-run there).
  const std::vector<int> usable = recovery_->Usable();
  if (usable.empty()) return absl::UnavailableError("controller: every worker of the job is lost or drained");
  planning::DispatchOptions d;
  d.num_workers = static_cast<int>(usable.size());
  d.microbatches_per_iteration = opt_.microbatches;
  d.microbatches_per_round = opt_.microbatches_per_round;
  d.g0 = next_g0_ % d.num_workers;
  d.mode = opt_.mode;
  auto plan = planning::BuildDispatchPlan(opt_.partition, store_->config().num_layers(), d);
  if (!plan.ok()) return plan.status();
  next_g0_ = plan->next_g0;
  f.slots = plan->slots;
  f.workers = d.num_workers;
  f.partition = opt_.partition;
  if (async) {
    book_->Get(T);
    book_->Get(T + 1);  // the optimizer's P_cp of T waits on T+1's uploads
  }
  // Backward stages' first layers: the forward stages must checkpoint their inputs.
  std::vector<int> bwd_starts;
  for (const planning::StageSlot& sl : plan->slots) {
    if (sl.kind == spec::StageKind::kBackward && sl.round == 0) bwd_starts.push_back(sl.first_layer);
  }
  for (planning::StageSlot sl : plan->slots) {
    sl.iteration = T;
    workers::StageTask task = ToStageTask(sl);
    task.book = async ? book_.get() : nullptr;
    task.recompute_ahead = opt_.recompute_ahead;
    if (sl.kind == spec::StageKind::kForward) {
      for (int l : bwd_starts) {
        if (l > sl.first_layer && l < sl.first_layer + sl.num_layers) task.save_inputs_of.push_back(l);
      }
    }
    f.done.push_back(recovery_->Submit(usable[static_cast<size_t>(sl.worker)], task, f.ctx));
  }
  // No further stage follows for now: issue each worker's last gradient download.
  for (auto& w : workers_) w->Flush();
  // A worker lost while this was dispatched got slots: they are re-run elsewhere.
  if (recovery_->Usable().size() != usable.size()) recovery_->Poke();
  return absl::OkStatus();
}

void Controller::FinishSyncIteration(int T, InFlight& f) {
  for (const auto& e : f.done) e->Wait();
  f.slots_rerun = recovery_->Forget(T);
  if (absl::Status err = f.ctx->error(); !err.ok()) {
    store_->ZeroGrads();
    acts_.Discard(T);
    f.result = absl::StatusOr<IterationStats>(err);
    return;
  }
  IterationStats st = FinishStats(T, f);
  double grad_norm = 0;
  if (opt_.data_parallel) {  // the nodes' gradients summed before the step (and their loss, for the report)
    auto sums = workers::SumIteration(*opt_.data_parallel, *store_, *f.ctx);
    if (!sums.ok()) {
      store_->ZeroGrads();
      f.result = absl::StatusOr<IterationStats>(sums.status());
      return;
    }
    st.loss = sums->nodes.loss;
    st.tokens = sums->nodes.tokens;
    grad_norm = sums->grad_norm;
  } else {
    grad_norm = workers::AdamW::GradNorm(*store_);
  }
  // The same policy as the asynchronous optimizer (workers/optim/step_policy.h).
  const workers::StepDecision d = workers::DecideStep(grad_norm, f.loss_scale, opt_.adamw.max_grad_norm, &scaler_);
  st.grad_norm = d.grad_norm;
  st.skipped_step = !d.apply && d.status.ok();
  if (!d.status.ok()) {
    f.result = absl::StatusOr<IterationStats>(d.status);
  } else {
    if (d.apply) {
      workers::MaybeDelayOptimizerForTest();
      const auto t0 = std::chrono::steady_clock::now();
      if (opt_.data_parallel && opt_.data_parallel->sharded()) {
        if (absl::Status shared =
                workers::StepShardedAndShare(adamw_, *store_, *opt_.data_parallel, f.lr, d.multiplier);
            !shared.ok()) {
          store_->ZeroGrads();
          f.result = absl::StatusOr<IterationStats>(shared);
          return;
        }
      } else {
        adamw_.StepAll(*store_, f.lr, d.multiplier);
      }
      st.optimizer_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    f.result = st;
  }
  store_->ZeroGrads();
  if (f.result->ok()) {
    (*f.result)->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - f.start).count();
    CountTraffic(**f.result);
  }
}

absl::StatusOr<int> Controller::SubmitIteration(const at::Tensor& tokens_in, const std::optional<at::Tensor>& labels_in,
                                                const std::optional<at::Tensor>& positions_in, bool validated) {
  const bool async = opt_.mode == planning::OptimizerMode::kAsync;
  if (async && inflight_.size() >= 2) {
    return absl::FailedPreconditionError("controller: two iterations in flight; await one first");
  }
  auto host = ToHostMicrobatches(tokens_in, labels_in, positions_in, /*training=*/true, validated);
  if (!host.ok()) return host.status();
  const int M = opt_.microbatches;
  // Data parallel: every node divides by the labelled tokens of all nodes (one collective on the
  // control group, in submission order on every node).
  int64_t valid = host->valid;
  if (opt_.data_parallel) {
    auto total = opt_.data_parallel->SumCounts({valid});
    if (!total.ok()) return total.status();
    valid = (*total)[0];
    if (valid == 0) return absl::InvalidArgumentError("batch: no node's share of it has a labelled token");
  }
  last_microbatch_rows_ = tokens_in.size(0) / M;
  last_seq_len_ = tokens_in.size(1);
  Replan();
  ApplyPlannedPartition();
  const int T = iteration_++;
  InFlight f;
  f.plan_changes = std::exchange(pending_changes_, {});
  f.start = std::chrono::steady_clock::now();
  f.timeline_start = timeline_ ? timeline_->Now() : 0;
  f.ctx = MakeRunContext(T, tokens_in.size(1), valid, std::move(host->positions));
  f.loss_scale = async ? optimizer_->loss_scale() : scaler_.scale();
  f.ctx->grad_multiplier = f.loss_scale;
  // Step k (1-based) applies iteration k-1's gradients.
  f.lr = opt_.lr_schedule.At(opt_.adamw.lr, opt_.first_step + T + 1);
  if (!async || inflight_.empty()) acts_.ResetPeak();
  for (int m = 0; m < M; ++m) {
    acts_.Put(workers::ActKind::kActivation, 0, m, std::move(host->tokens[m]), act_consumers_[0], T);
    acts_.Put(workers::ActKind::kLabels, 0, m, std::move(host->labels[m]), 1, T);
  }
  if (absl::Status st = DispatchIteration(T, f); !st.ok()) return st;
  if (async) {
    optimizer_->Enqueue({T, f.ctx, f.lr, f.loss_scale});
  } else {
    FinishSyncIteration(T, f);  // wait for every stage, then step
  }
  inflight_.emplace(T, std::move(f));
  return T;
}

IterationStats Controller::FinishStats(int iteration, InFlight& f) {
  IterationStats st;
  st.iteration = iteration;
  st.loss = f.ctx->loss();
  st.tokens = f.ctx->tokens();
  st.lr = f.lr;
  st.loss_scale = f.loss_scale;
  st.activation_peak_bytes = acts_.peak_bytes();
  st.partition = f.partition.ToString();
  st.workers = f.workers;
  st.slots_rerun = f.slots_rerun;
  st.plan_changes = f.plan_changes;
  if (planned_ && measured_ && planned_->partition == f.partition) st.predicted_bubble = planned_->predicted_bubble;
  st.partition_problem = plan_problem_;
  st.worker_busy_s.assign(workers_.size(), 0);
  if (timeline_) {
    double first = 1e300, last = 0;
    for (const workers::TimelineEntry& e : timeline_->EntriesEndingSince(f.timeline_start)) {
      if (e.job != opt_.timeline_job || e.iteration != iteration || e.start_s < f.timeline_start ||
          e.stream != "compute") {
        continue;
      }
      st.worker_busy_s[static_cast<size_t>(e.worker)] += e.end_s - e.start_s;
      first = std::min(first, e.start_s);
      last = std::max(last, e.end_s);
    }
    double busy = 0;
    for (double b : st.worker_busy_s) busy += b;
    if (last > first) st.bubble_ratio = 1 - busy / (static_cast<double>(f.workers) * (last - first));
  }
  RecordProfile(iteration, f);
  return st;
}

absl::StatusOr<IterationStats> Controller::AwaitIteration(int iteration) {
  auto it = inflight_.find(iteration);
  if (it == inflight_.end()) {
    return absl::NotFoundError(absl::StrCat("controller: iteration ", iteration, " is not in flight"));
  }
  InFlight f = std::move(it->second);
  inflight_.erase(it);
  if (f.result) return *f.result;  // sync: already complete

  for (const auto& e : f.done) e->Wait();
  f.slots_rerun = recovery_->Forget(iteration);
  book_->retained().DropThrough(iteration);  // no slot of it runs again
  workers::StepResult step = f.drained_step ? *f.drained_step : optimizer_->AwaitStep(iteration);
  book_->PruneBefore(iteration - 1);
  if (absl::Status err = f.ctx->error(); !err.ok()) {
    acts_.Discard(iteration);
    return err;
  }
  if (!step.status.ok()) return step.status;
  IterationStats st = FinishStats(iteration, f);
  if (step.node_sums) {  // data parallel: what the optimizer worker summed over the nodes
    st.loss = step.node_sums->loss;
    st.tokens = step.node_sums->tokens;
  }
  st.grad_norm = step.grad_norm;
  st.skipped_step = step.skipped;
  st.optimizer_seconds = step.seconds;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - f.start).count();
  CountTraffic(st);
  return st;
}

void Controller::CountTraffic(IterationStats& st) {
  if (!opt_.data_parallel) return;
  const workers::DataParallelGroup::Traffic now = opt_.data_parallel->traffic();
  st.collective_seconds = now.seconds - traffic_seen_.seconds;
  st.collective_bytes = now.bytes - traffic_seen_.bytes;
  traffic_seen_ = now;
}

absl::Status Controller::Flush() {
  if (opt_.mode != planning::OptimizerMode::kAsync) return absl::OkStatus();
  if (!inflight_.empty()) {
    return absl::FailedPreconditionError("controller: await every submitted iteration before Flush");
  }
  // No iteration `iteration_` will upload before the optimizer finishes: release its uploads.
  book_->ReleaseUploads(iteration_);
  optimizer_->WaitIdle();
  return absl::OkStatus();
}

}  // namespace rp::scheduler

namespace rp::scheduler {

int64_t Controller::OptimizerStateBytes() const { return optimizer_ ? optimizer_->state_bytes() : adamw_.StateBytes(); }

OptimizerSnapshot Controller::Snapshot() const {
  OptimizerSnapshot s;
  if (optimizer_) {
    s.adamw = optimizer_->adamw_state();
    s.loss_scale = optimizer_->loss_scale();
    s.good_steps = optimizer_->good_steps();
  } else {
    s.adamw = adamw_.state();
    s.loss_scale = scaler_.scale();
    s.good_steps = scaler_.good_steps();
  }
  return s;
}

}  // namespace rp::scheduler
