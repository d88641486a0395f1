#include "scheduler/runtime/engine_impl.h"

#include <ATen/ATen.h>

#include <cmath>
#include <deque>
#include <future>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/export.h"
#include "scheduler/runtime/model_adapter.h"
#include "scheduler/runtime/token_dataset.h"
#include "workers/io/atomic_dir.h"
#include "workers/io/checkpoint.h"
#include "workers/io/confined_fs.h"
#include "workers/io/hf_config.h"
#include "workers/io/safetensors_reader.h"
#include "workers/models/layers.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler {

namespace {
// A batch as the controller takes it.
struct TensorBatch {
  at::Tensor tokens;
  std::optional<at::Tensor> labels;
};
struct WaitingFeed {  // FeedBatchAsync: a batch waiting for room in the queue
  TensorBatch batch;
  std::function<void(absl::Status)> done;
};
}  // namespace

struct Engine::Impl::Job {
  JobId id = 0;
  JobSpec spec;
  workers::models::TransformerConfig model;  // spec.model as the engine runs it
  at::ScalarType dtype = at::kFloat;         // spec.precision
  // The job's host state. Both are released (reset under run_mu and mu) once a daemon job has
  // ended and its final state is on disk; readers hold run_mu or copy the pointers under mu.
  std::shared_ptr<workers::HostModelStore> store;  // null until the runner builds the job
  std::shared_ptr<Controller> controller;
  ControllerOptions controller_options;  // decided at Submit, used by BuildJob
  std::mutex run_mu;                     // held while an iteration runs (Parameter reads wait for it)
  // After the release: where the final weights are, and what export needs to know of them.
  std::string final_checkpoint;
  std::vector<ParameterShape> final_shapes;
  std::unique_ptr<workers::io::SafetensorsFile> final_weights;  // opened on first Parameter() (run_mu)

  std::mutex mu;
  std::condition_variable cv;
  std::deque<TensorBatch> batches;
  std::deque<WaitingFeed> waiting;              // at most spec.max_queued_batches
  std::unique_ptr<runtime::TokenDataset> data;  // token-file jobs (opened at Submit: mapped, not read)
  bool input_closed = false;
  bool cancel = false;
  bool pause = false;               // requested; honoured between iterations
  bool controller_started = false;  // the runner took the job (guarded by mu)
  JobState state = JobState::kQueued;
  std::string message;  // of the latest state change or progress report
  std::vector<JobEvent> events;
  // Checkpoints: requests the runner serves at an iteration boundary; progress counters.
  struct CheckpointRequest {
    std::string note;
    std::shared_ptr<std::promise<absl::StatusOr<CheckpointInfo>>> done;
  };
  std::deque<CheckpointRequest> checkpoints;
  int64_t first_step = 0;       // steps taken before this run (resumed jobs)
  int64_t steps_done = 0;       // steps reported in this run
  int64_t consumed_offset = 0;  // batches consumed before this run
  int64_t consumed = 0;         // batches taken from the queue in this run
  int checkpoint_failures = 0;  // policy checkpoints failed in a row (runner only)
  std::string pause_reason;     // why the runner paused the job itself (guarded by mu)

  bool terminal() const { return IsTerminal(state); }
  absl::StatusOr<at::Tensor> ReadParameter(const std::string& name);
  void Emit(JobEvent e) {  // caller holds mu
    e.time = std::chrono::system_clock::now();
    events.push_back(std::move(e));
    cv.notify_all();
  }
  void SetState(JobState s, std::string why = "") {  // caller holds mu
    state = s;
    message = why;
    Emit({JobEvent::Kind::kState, s, {}, std::move(why)});
  }
  // Writes the state at the current step as <checkpoint_root>/step-<N> and reports it (caller
  // holds run_mu, at an iteration boundary with the optimizer flushed). One that existed already
  // holds this very state: it is returned, and reported again only if `report_existing`.
  absl::StatusOr<CheckpointInfo> CheckpointNow(const std::string& note, bool report_existing = true);
  // A checkpoint result as an event (caller holds mu): written, or failed and why.
  void ReportCheckpoint(const absl::StatusOr<CheckpointInfo>& info, int64_t step) {
    if (info.ok()) {
      JobEvent e{JobEvent::Kind::kCheckpoint, state, {}, ""};
      e.checkpoint = *info;
      Emit(e);
      return;
    }
    JobEvent e{JobEvent::Kind::kCheckpointFailed, state, {}, ""};
    e.message = absl::StrCat("checkpoint at step ", step, " failed: ", info.status().message());
    e.checkpoint.step = step;
    Emit(e);
  }
};

absl::StatusOr<planning::Partition> PlanFromParameterSizes(const planning::ModelConfig& model, int num_workers,
                                                           int microbatches) {
  planning::CostModel costs;
  for (int l = 0; l < model.num_layers(); ++l) {
    planning::LayerCost c;
    // The embedding is a lookup, not a matmul: count it as one row per token, i.e. cheap. The
    // head's matmul costs its weight even when it is tied to the embedding.
    const double work = l == 0                        ? static_cast<double>(model.hidden)
                        : l == model.num_layers() - 1 ? static_cast<double>(model.vocab * model.hidden + model.hidden)
                                                      : static_cast<double>(model.LayerParams(l));
    c.fwd_s = work;
    c.bwd_s = 3 * work;
    c.fused_s = 3 * work;
    costs.layers.push_back(c);
  }
  auto r = planning::AutoPartition({&costs, num_workers, microbatches, 0});
  if (!r.ok()) return r.status();
  return r->partition;
}

namespace {

// A model's parameters in engine order, tied ones once (what a HostModelStore holds).
std::vector<ParameterShape> ParamShapesOf(const workers::models::TransformerConfig& m) {
  std::vector<ParameterShape> out;
  for (const auto& p : workers::models::ModelParams(m)) out.push_back({p.name, p.shape});
  return out;
}

TensorValue ToValue(const at::Tensor& t) {
  TensorValue v;
  const at::Tensor c = t.to(at::kFloat).contiguous();
  v.shape.assign(c.sizes().begin(), c.sizes().end());
  v.data.assign(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  return v;
}

// Shape, divisibility and id ranges of a facade batch, against the job's model: the one
// validation a batch gets before it is queued.
absl::Status ValidateBatch(const Batch& b, int64_t vocab, int microbatches) {
  if (b.rows <= 0 || b.cols <= 0) return absl::InvalidArgumentError("batch: empty batch");
  if (b.rows > (int64_t{1} << 20) || b.cols > (int64_t{1} << 20) || b.rows * b.cols > (int64_t{1} << 28)) {
    return absl::InvalidArgumentError("batch: larger than 2^28 tokens");
  }
  const size_t n = static_cast<size_t>(b.rows * b.cols);
  if (b.tokens.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: ", b.tokens.size(), " token ids for a ", b.rows, " x ", b.cols, " batch"));
  }
  if (!b.labels.empty() && b.labels.size() != n) {
    return absl::InvalidArgumentError("batch: labels must have the shape of tokens");
  }
  if (b.rows % microbatches != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: ", b.rows, " sequences cannot be split into ", microbatches, " equal micro-batches"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("batch: token id ", b.tokens[i], " at position ", i,
                                                     " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  for (size_t i = 0; i < b.labels.size(); ++i) {
    const int32_t l = b.labels[i];
    if (l != Batch::kIgnoreLabel && (l < 0 || l >= vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: label ", l, " at position ", i, " must be -100 or lie in [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

TensorBatch ToTensors(const Batch& b) {
  TensorBatch t;
  t.tokens = at::empty({b.rows, b.cols}, at::kLong);
  std::copy(b.tokens.begin(), b.tokens.end(), t.tokens.data_ptr<int64_t>());
  if (!b.labels.empty()) {
    at::Tensor l = at::empty({b.rows, b.cols}, at::kLong);
    std::copy(b.labels.begin(), b.labels.end(), l.data_ptr<int64_t>());
    t.labels = l;
  }
  return t;
}

}  // namespace

int64_t DefaultStageMemoryCap(const std::vector<workers::Device*>& devices) {
  std::map<std::string, int> sharing;  // physical device -> workers on it
  for (workers::Device* d : devices) ++sharing[d->torch_device().str()];
  int64_t cap = 0;
  for (workers::Device* d : devices) {
    const int64_t total = d->Memory().device_total_bytes;
    if (total <= 0) return 0;
    const int64_t share = total / sharing[d->torch_device().str()] * 9 / 10 / 2;
    cap = cap == 0 ? share : std::min(cap, share);
  }
  return cap;
}

absl::StatusOr<std::unique_ptr<Engine::Impl>> Engine::Impl::Create(const EngineOptions& options) {
  std::unique_ptr<Impl> e(new Impl());
  workers::DeviceOptions dopt;
  dopt.keep_weights_resident = options.keep_weights_resident;
  dopt.pinned_slab_bytes = options.pinned_slab_bytes;
  auto devices = workers::CreateDevices(options.devices, &e->timeline_, dopt);  // they record into our timeline
  if (!devices.ok()) return devices.status();
  e->devices_ = std::move(*devices);
  e->runner_ = std::thread([raw = e.get()] { raw->RunnerLoop(); });
  return e;
}

Engine::Impl::~Impl() { Shutdown(); }

void Engine::Impl::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    for (auto& [id, job] : jobs_) {
      std::lock_guard<std::mutex> jl(job->mu);
      job->cancel = true;
      job->cv.notify_all();
    }
  }
  cv_.notify_all();
  if (runner_.joinable()) runner_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, job] : jobs_) {
    std::deque<WaitingFeed> waiting;
    {
      std::lock_guard<std::mutex> jl(job->mu);
      if (!job->terminal()) job->SetState(JobState::kCancelled, "engine shut down");
      waiting.swap(job->waiting);
    }
    for (auto& w : waiting) w.done(absl::UnavailableError("the engine is shutting down"));
  }
}

std::shared_ptr<Engine::Impl::Job> Engine::Impl::Find(JobId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

absl::StatusOr<JobId> Engine::Impl::Submit(const JobSpec& spec_in) {
  // Validation only: the files a job names are checked (headers, checksums) but nothing is
  // allocated or loaded until the runner takes the job (BuildJob), so a queued job costs no host
  // memory and Submit returns at once.
  JobSpec spec = spec_in;
  auto model = runtime::ToTransformerConfig(spec.model);
  if (!model.ok()) return model.status();
  if (spec.max_queued_batches < 1) return absl::InvalidArgumentError("job: max_queued_batches must be >= 1");
  if (spec.max_steps < 0) return absl::InvalidArgumentError("job: max_steps must be >= 0");
  const int N = static_cast<int>(devices_.size());
  if (spec.microbatches == 0) spec.microbatches = N;
  if (!spec.partition && !spec.auto_partition) {
    auto p = PlanFromParameterSizes(spec.model, N, spec.microbatches);
    if (!p.ok()) return p.status();
    spec.partition = *p;
  }
  auto job = std::make_shared<Job>();
  job->model = *model;
  job->dtype = runtime::ToScalarType(spec.precision);
  if (!spec.hf_dir.empty()) {
    if (absl::Status st = workers::io::CheckHfWeights(spec.hf_dir, job->model); !st.ok()) return st;
  }
  if (!spec.lora_adapter_dir.empty()) {
    if (job->model.lora.rank <= 0) return absl::InvalidArgumentError("job: an adapter dir needs a LoRA model");
    if (absl::Status st = workers::io::CheckPeftAdapter(spec.lora_adapter_dir, job->model); !st.ok()) return st;
  }
  if (!spec.resume_from.empty()) {
    auto meta = workers::io::VerifyCheckpoint(spec.resume_from);
    if (!meta.ok()) return meta.status();
    job->first_step = meta->step;
    job->consumed_offset = meta->batches_consumed;
    if (meta->fused > 0) {
      spec.partition = planning::Partition{meta->forward, meta->fused, meta->backward};
      spec.auto_partition = false;
    }
  }
  if (spec.token_file) {
    const TokenFileSource& tf = *spec.token_file;
    auto ds = runtime::TokenDataset::Open(tf.path, tf.format, tf.global_batch, tf.sequence_length);
    if (!ds.ok()) return absl::InvalidArgumentError(absl::StrCat("data.token_file: ", ds.status().message()));
    if (tf.global_batch % spec.microbatches != 0) {
      return absl::InvalidArgumentError(absl::StrCat("data.token_file: global_batch ", tf.global_batch,
                                                     " cannot be split into ", spec.microbatches, " micro-batches"));
    }
    if (tf.max_epochs < 1) return absl::InvalidArgumentError("data.token_file: max_epochs must be >= 1");
    job->data = std::move(*ds);
  }
  ControllerOptions& o = job->controller_options;
  if (spec.partition) o.partition = *spec.partition;
  o.microbatches = spec.microbatches;
  o.microbatches_per_round = spec.microbatches_per_round;
  o.adamw = runtime::ToAdamW(spec.optimizer);
  o.lr_schedule = runtime::ToLrSchedule(spec.lr_schedule);
  o.loss_scaler.enabled = spec.precision == Precision::kFloat16;
  o.mode = spec.optimizer_mode;
  o.auto_partition = spec.auto_partition;
  {
    std::vector<workers::Device*> raw_devices;
    for (auto& d : devices_) raw_devices.push_back(d.get());
    o.stage_memory_cap = spec.stage_memory_cap > 0 ? spec.stage_memory_cap : DefaultStageMemoryCap(raw_devices);
  }
  if (absl::Status st = Controller::ValidateOptions(o, job->model, N); !st.ok()) return st;
  job->spec = spec;
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return absl::UnavailableError("engine is shutting down");
  job->id = next_id_++;
  {
    std::lock_guard<std::mutex> jl(job->mu);
    job->SetState(JobState::kQueued);
  }
  jobs_[job->id] = job;
  pending_.push_back(job->id);
  cv_.notify_all();
  return job->id;
}

absl::Status Engine::Impl::BuildJob(Job& job) {
  const JobSpec& spec = job.spec;
  auto progress = [&job](std::string what) {
    std::lock_guard<std::mutex> lock(job.mu);
    job.message = what;
    job.Emit({JobEvent::Kind::kProgress, job.state, {}, std::move(what)});
  };
  progress("allocating the host model store");
  std::shared_ptr<workers::HostModelStore> store;
  try {
    store = std::make_shared<workers::HostModelStore>(job.model, job.dtype, spec.seed);
    if (devices_.front()->torch_device().is_cuda()) {
      // Masters in pinned memory: weight uploads become asynchronous DMA (paper §4.2).
      store->RelocateMasters(
          [d = devices_.front().get()](at::IntArrayRef sizes, at::ScalarType dt) { return d->EmptyHost(sizes, dt); });
    }
  } catch (const std::exception& ex) {
    return absl::ResourceExhaustedError(absl::StrCat("host memory for the model store: ", ex.what()));
  }
  if (!spec.hf_dir.empty()) {
    progress("loading weights from " + spec.hf_dir);
    if (absl::Status st = workers::io::LoadHfWeights(spec.hf_dir, store.get()); !st.ok()) return st;
  }
  if (!spec.lora_adapter_dir.empty()) {
    progress("loading the LoRA adapter from " + spec.lora_adapter_dir);
    if (absl::Status st = workers::io::LoadPeftAdapter(spec.lora_adapter_dir, store.get()); !st.ok()) return st;
  }
  ControllerOptions o = job.controller_options;
  if (!spec.resume_from.empty()) {
    progress("loading checkpoint " + spec.resume_from);
    workers::AdamWState adamw;
    auto meta = workers::io::ReadCheckpoint(spec.resume_from, store.get(), &adamw);
    if (!meta.ok()) return meta.status();
    o.first_step = meta->step;
    o.resume_adamw = adamw;
    o.resume_loss_scale = meta->loss_scale;
    o.resume_good_steps = meta->good_steps;
  }
  std::vector<workers::Device*> raw;
  for (auto& d : devices_) raw.push_back(d.get());
  auto c = Controller::Create(o, store.get(), raw, &timeline_);
  if (!c.ok()) return c.status();
  std::lock_guard<std::mutex> lock(job.mu);
  job.store = std::move(store);
  job.controller = std::move(*c);
  return absl::OkStatus();
}

absl::Status Engine::Impl::FeedBatch(JobId id, Batch batch, std::chrono::milliseconds timeout) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  if (job->spec.token_file) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " reads a token file; it takes no streamed batches"));
  }
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->terminal()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " accepts no more batches (", JobStateName(job->state), ")"));
    }
  }
  // Against the spec (vocab, micro-batches): a queued job has no controller yet.
  if (absl::Status st = ValidateBatch(batch, job->model.vocab, job->spec.microbatches); !st.ok()) return st;
  TensorBatch t = ToTensors(batch);
  std::unique_lock<std::mutex> lock(job->mu);
  const bool room = job->cv.wait_for(lock, timeout, [&] {
    return job->cancel || job->input_closed || job->terminal() ||
           (job->waiting.empty() && static_cast<int>(job->batches.size()) < job->spec.max_queued_batches);
  });
  if (job->input_closed || job->terminal() || job->cancel) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " accepts no more batches (", JobStateName(job->state), ")"));
  }
  if (!room) {
    return absl::DeadlineExceededError(
        absl::StrCat("job ", id, ": batch queue still full after ", timeout.count(), " ms"));
  }
  job->batches.push_back(std::move(t));
  job->cv.notify_all();
  return absl::OkStatus();
}

absl::Status Engine::Impl::FeedBatchAsync(JobId id, Batch batch, std::function<void(absl::Status)> done) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  if (job->spec.token_file) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " reads a token file; it takes no streamed batches"));
  }
  if (absl::Status st = ValidateBatch(batch, job->model.vocab, job->spec.microbatches); !st.ok()) return st;
  TensorBatch t = ToTensors(batch);
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->input_closed || job->terminal() || job->cancel) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " accepts no more batches (", JobStateName(job->state), ")"));
    }
    if (job->waiting.empty() && static_cast<int>(job->batches.size()) < job->spec.max_queued_batches) {
      job->batches.push_back(std::move(t));
      job->cv.notify_all();
    } else if (static_cast<int>(job->waiting.size()) < job->spec.max_queued_batches) {
      job->waiting.push_back({std::move(t), std::move(done)});  // the runner admits it when there is room
      return absl::OkStatus();
    } else {
      return absl::ResourceExhaustedError(absl::StrCat("job ", id, ": ", job->batches.size(), " batches queued and ",
                                                       job->waiting.size(),
                                                       " waiting for room (the job's limit); retry later"));
    }
  }
  done(absl::OkStatus());
  return absl::OkStatus();
}

absl::Status Engine::Impl::CloseInput(JobId id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> lock(job->mu);
  job->input_closed = true;
  job->cv.notify_all();
  return absl::OkStatus();
}

absl::Status Engine::Impl::Cancel(JobId id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  bool never_ran = false;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->terminal()) return absl::FailedPreconditionError(absl::StrCat("job ", id, " already ended"));
    job->cancel = true;
    if (job->state == JobState::kQueued || (job->state == JobState::kPaused && !job->controller_started)) {
      job->SetState(JobState::kCancelled, "cancelled before it started");
      never_ran = !job->controller_started;  // the runner will never take it
    }
    job->cv.notify_all();
  }
  if (never_ran) {  // never built, holds no host state; its waiting feeds end here
    std::deque<WaitingFeed> waiting;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      waiting.swap(job->waiting);
      job->batches.clear();
    }
    for (auto& w : waiting) w.done(absl::FailedPreconditionError(absl::StrCat("job ", id, " was cancelled")));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::Pause(JobId id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> lock(job->mu);
  if (job->terminal() || job->cancel) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " already ended"));
  }
  job->pause = true;
  if (job->state == JobState::kQueued) job->SetState(JobState::kPaused, "paused before it started");
  job->cv.notify_all();
  return absl::OkStatus();
}

absl::Status Engine::Impl::Resume(JobId id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->terminal() || job->cancel) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, " already ended"));
    }
    job->pause = false;
    if (job->state == JobState::kPaused && !job->controller_started) job->SetState(JobState::kQueued);
    job->cv.notify_all();
  }
  cv_.notify_all();  // a job paused while queued may start now
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ParameterShape>> Engine::Impl::ParameterShapes(JobId id) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> run(job->run_mu);
  if (!job->store && !job->final_shapes.empty()) return job->final_shapes;
  if (!job->store) return ParamShapesOf(job->model);  // not built yet (or cancelled before)
  std::vector<ParameterShape> out;
  for (int i = 0; i < job->store->num_params(); ++i)
    out.push_back({job->store->param(i).name, job->store->param(i).shape});
  return out;
}

namespace {

// Writes the job's state as <root>/step-<step> (the caller ensures an iteration boundary with
// the optimizer flushed) and keeps the newest `keep_last`. A checkpoint of that step that
// exists already holds this very state: it is returned as is.
absl::StatusOr<CheckpointInfo> WriteJobCheckpoint(const workers::HostModelStore& store, const Controller& c,
                                                  int64_t step, int64_t consumed, const std::string& root,
                                                  int keep_last, const std::string& note) {
  if (root.empty()) return absl::FailedPreconditionError("the job has no checkpoint directory");
  const std::string dir = absl::StrCat(root, "/step-", step);
  if (workers::io::KindOf(dir + "/meta.json") == workers::io::FileKind::kFile)
    return CheckpointInfo{dir, step, consumed};
  const OptimizerSnapshot snap = c.Snapshot();
  workers::io::CheckpointMeta meta;
  meta.step = step;
  meta.batches_consumed = consumed;
  meta.loss_scale = snap.loss_scale;
  meta.good_steps = snap.good_steps;
  meta.forward = c.partition().forward;
  meta.fused = c.partition().fused;
  meta.backward = c.partition().backward;
  meta.note = note;
  if (absl::Status st = workers::io::WriteCheckpoint(dir, store, snap.adamw, meta); !st.ok()) return st;
  // Pruning never follows a symlink and stays beneath the daemon's roots (confined_fs).
  const auto all = workers::io::ListCheckpoints(root);
  for (size_t i = static_cast<size_t>(std::max(keep_last, 1)); i < all.size(); ++i) {
    (void)workers::io::RemoveTree(all[i]);
  }
  // Temporaries torn by a crash mid-write (the job's writes are serialised by run_mu: none is live).
  if (auto names = workers::io::ListDir(root); names.ok()) {
    for (const std::string& n : *names) {
      if (workers::io::IsAtomicDirTemporary(n)) (void)workers::io::RemoveTree(root + "/" + n);
    }
  }
  return CheckpointInfo{dir, step, consumed};
}

}  // namespace

absl::StatusOr<CheckpointInfo> Engine::Impl::Job::CheckpointNow(const std::string& note, bool report_existing) {
  int64_t step, cursor;
  {
    std::lock_guard<std::mutex> lock(mu);
    step = first_step + steps_done;
    cursor = consumed_offset + consumed;
  }
  const bool existed = !spec.checkpoint_root.empty() &&
                       workers::io::KindOf(absl::StrCat(spec.checkpoint_root, "/step-", step, "/meta.json")) ==
                           workers::io::FileKind::kFile;
  auto info =
      WriteJobCheckpoint(*store, *controller, step, cursor, spec.checkpoint_root, spec.checkpoint_keep_last, note);
  std::lock_guard<std::mutex> lock(mu);
  if (report_existing || !existed || !info.ok()) ReportCheckpoint(info, step);
  return info;
}

absl::StatusOr<CheckpointInfo> Engine::Impl::Checkpoint(JobId id, const std::string& note) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::future<absl::StatusOr<CheckpointInfo>> result;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (!job->controller_started) {
      return absl::FailedPreconditionError("the job has not started; nothing to checkpoint");
    }
    if (!job->terminal()) {
      auto promise = std::make_shared<std::promise<absl::StatusOr<CheckpointInfo>>>();
      result = promise->get_future();
      job->checkpoints.push_back({note, promise});
      job->cv.notify_all();
    }
  }
  if (result.valid()) return result.get();
  // Ended: the store holds the final weights (the runner flushed) and nothing runs any more.
  std::lock_guard<std::mutex> run(job->run_mu);
  int64_t step, consumed;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    step = job->first_step + job->steps_done;
    consumed = job->consumed_offset + job->consumed;
  }
  if (!job->store) {  // released: its final checkpoint holds exactly this state
    if (job->final_checkpoint.empty()) {
      return absl::FailedPreconditionError("the job ended without a consistent state to checkpoint");
    }
    return CheckpointInfo{job->final_checkpoint, step, consumed};
  }
  return job->CheckpointNow(note);
}

absl::StatusOr<planning::ModelConfig> Engine::Impl::ModelConfig(JobId id) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> run(job->run_mu);
  planning::ModelConfig m = runtime::FromTransformerConfig(job->store ? job->store->config() : job->model);
  m.name = job->spec.model.name;
  return m;
}

absl::StatusOr<JobInfo> Engine::Impl::Info(JobId id) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> lock(job->mu);
  JobInfo info;
  info.state = job->state;
  info.message = job->message;
  info.steps_done = job->first_step + job->steps_done;
  info.batches_consumed = job->consumed_offset + job->consumed;
  info.queued_batches = static_cast<int>(job->batches.size() + job->waiting.size());
  info.total_steps = job->spec.max_steps > 0 ? job->first_step + job->spec.max_steps : 0;
  if (job->data) {
    const int64_t data_steps = job->data->batches_per_epoch() * job->spec.token_file->max_epochs;
    info.total_steps = info.total_steps > 0 ? std::min(info.total_steps, data_steps) : data_steps;
  }
  return info;
}

absl::StatusOr<std::vector<JobEvent>> Engine::Impl::AwaitEvents(JobId id, std::chrono::milliseconds timeout) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait_for(lock, timeout, [&] { return !job->events.empty(); });
  std::vector<JobEvent> out;
  out.swap(job->events);
  return out;
}

// The fp32 value of a parameter (caller holds run_mu): from the store, or once released from
// the final checkpoint.
absl::StatusOr<at::Tensor> Engine::Impl::Job::ReadParameter(const std::string& name) {
  if (!store) {  // not built yet, or released: read the final checkpoint
    if (final_checkpoint.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      if (!terminal()) {
        return absl::FailedPreconditionError(absl::StrCat("job ", id, " has not started; its weights are not loaded"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " ended without weights to keep (it failed, or was cancelled before it started)"));
    }
    if (!final_weights) {
      auto f = workers::io::SafetensorsFile::Open(final_checkpoint + "/weights.safetensors");
      if (!f.ok()) return f.status();
      final_weights = std::move(*f);
    }
    if (!final_weights->Find(name)) return absl::NotFoundError(absl::StrCat("job ", id, " has no parameter ", name));
    return final_weights->Read(name, at::kFloat);
  }
  const int i = store->FindParam(name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("job ", id, " has no parameter ", name));
  const workers::HostParam& p = store->param(i);
  return p.fp32.defined() ? p.fp32 : p.master.to(at::kFloat);  // frozen (LoRA base): master only
}

absl::StatusOr<TensorValue> Engine::Impl::Parameter(JobId id, const std::string& name) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> run(job->run_mu);
  auto t = job->ReadParameter(name);
  if (!t.ok()) return t.status();
  return ToValue(*t);
}

absl::StatusOr<int64_t> Engine::Impl::Export(JobId id, const std::string& dir, ExportKind kind) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> run(job->run_mu);  // a consistent state: between iterations, or final
  std::vector<ParameterShape> shapes;
  if (job->store) {
    for (int i = 0; i < job->store->num_params(); ++i)
      shapes.push_back({job->store->param(i).name, job->store->param(i).shape});
  } else if (!job->final_shapes.empty()) {
    shapes = job->final_shapes;
  } else {
    auto probe = job->ReadParameter("");  // the reason there are no weights
    return probe.ok() ? absl::InternalError("no parameters") : probe.status();
  }
  return runtime::WriteExport(
      dir, job->model, shapes, [&job](const std::string& name) { return job->ReadParameter(name); }, job->dtype, kind);
}

EngineStats Engine::Impl::Stats() const {
  EngineStats s;
  for (const auto& d : devices_) {
    DeviceStats& ds = s.devices.emplace_back();
    ds.name = d->name();
    ds.description = d->description();
    ds.activation_up_bytes = d->TransferBytes(workers::StreamKind::kActivationUp);
    ds.activation_down_bytes = d->TransferBytes(workers::StreamKind::kActivationDown);
    ds.param_up_bytes = d->TransferBytes(workers::StreamKind::kParamUp);
    ds.grad_down_bytes = d->TransferBytes(workers::StreamKind::kGradDown);
    const workers::Device::MemoryStats m = d->Memory();
    ds.memory_total_bytes = m.device_total_bytes;
    ds.memory_in_use_bytes = m.device_in_use_bytes;
    ds.memory_peak_bytes = m.device_peak_bytes;
    ds.pinned_reserved_bytes = m.pinned_reserved_bytes;
    ds.pinned_in_use_bytes = m.pinned_in_use_bytes;
  }
  std::lock_guard<std::mutex> lock(mu_);
  s.jobs_total = static_cast<int>(jobs_.size());
  for (const auto& [id, job] : jobs_) {
    std::lock_guard<std::mutex> jl(job->mu);
    if (!job->terminal()) ++s.jobs_active;
    if (job->state == JobState::kRunning && job->store) s.host_model_bytes = job->store->HostBytes();
  }
  return s;
}

void Engine::Impl::RunnerLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return shutdown_ || (job = TakeRunnableLocked()) != nullptr; });
      if (shutdown_) return;
    }
    try {  // the job's barrier: an unexpected exception fails this job, never the daemon
      bool ended;
      {  // on the workers from here: loading the host state is part of running the job
        std::lock_guard<std::mutex> lock(job->mu);
        ended = job->terminal();  // cancelled as it was taken
        if (!ended) job->SetState(JobState::kRunning);
      }
      absl::Status built = absl::OkStatus();
      if (!job->store && !ended) {  // Parameter() and friends wait for it (run_mu)
        std::lock_guard<std::mutex> run(job->run_mu);
        built = BuildJob(*job);
      }
      if (built.ok()) {
        RunJob(*job);
      } else {
        std::lock_guard<std::mutex> lock(job->mu);
        if (!job->terminal()) job->SetState(JobState::kFailed, absl::StrCat("could not start: ", built.message()));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(job->mu);
      if (!job->terminal()) job->SetState(JobState::kFailed, absl::StrCat("internal error: ", e.what()));
    }
    // Checkpoint requests that raced with the end of the job: the store is final now. Feeds
    // still waiting for room never get it.
    std::deque<Job::CheckpointRequest> reqs;
    std::deque<WaitingFeed> waiting;
    JobState state;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      reqs.swap(job->checkpoints);
      waiting.swap(job->waiting);
      job->batches.clear();
      state = job->state;
    }
    for (auto& w : waiting) {
      w.done(absl::FailedPreconditionError(absl::StrCat("job ", job->id, " has ended (", JobStateName(state), ")")));
    }
    std::unique_lock<std::mutex> run(job->run_mu);
    for (auto& r : reqs) {
      if (state == JobState::kFailed) {
        if (r.done)
          r.done->set_value(absl::FailedPreconditionError("the job failed; no consistent state to checkpoint"));
      } else {
        auto info = job->CheckpointNow(r.note);
        if (r.done) r.done->set_value(info);
      }
    }
    ReleaseEnded(*job);
  }
}

// A daemon job (it has a checkpoint root) costs host memory only while it runs: once it ended
// (its final checkpoint was written before the terminal state, see RunJob), the store and the
// controller are freed; export, Parameter and Checkpoint read the final checkpoint. A failed
// job's state is not consistent: it is freed at once. Without a root (library use) or when the
// final checkpoint could not be written, the store stays. Caller holds run_mu.
void Engine::Impl::ReleaseEnded(Job& job) {
  if (!job.store || job.spec.checkpoint_root.empty()) return;
  {
    std::lock_guard<std::mutex> lock(job.mu);
    if (!IsTerminal(job.state)) return;
    if (job.state != JobState::kFailed && job.final_checkpoint.empty()) return;  // keep: nothing on disk
  }
  job.final_shapes = ParamShapesOf(job.store->config());
  std::lock_guard<std::mutex> lock(job.mu);
  job.controller.reset();
  job.store.reset();
}

std::shared_ptr<Engine::Impl::Job> Engine::Impl::TakeRunnableLocked() {
  std::shared_ptr<Job> best;
  size_t best_at = 0;
  for (size_t i = 0; i < pending_.size();) {
    auto& job = jobs_[pending_[i]];
    std::lock_guard<std::mutex> jl(job->mu);
    if (job->terminal()) {  // cancelled while queued
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (!job->pause && (!best || job->spec.priority > best->spec.priority)) {
      best = job;
      best_at = i;
    }
    ++i;
  }
  if (best) {
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(best_at));
    std::lock_guard<std::mutex> jl(best->mu);
    best->controller_started = true;
  }
  return best;
}

void Engine::Impl::RunJob(Job& job) {
  {
    std::lock_guard<std::mutex> lock(job.mu);
    if (job.terminal()) return;  // cancelled while queued
    if (job.state != JobState::kRunning) job.SetState(JobState::kRunning);
  }
  Controller& c = *job.controller;
  int64_t steps = 0;
  int64_t skipped_in_a_row = 0;  // fp16 steps skipped for overflow, consecutively
  std::optional<int> pending;    // async: the submitted iteration not yet awaited
  // Awaits the pending iteration and reports it; false when the job must stop (it failed).
  auto finish_pending = [&]() -> bool {
    if (!pending) return true;
    absl::StatusOr<IterationStats> st;
    {
      std::lock_guard<std::mutex> run(job.run_mu);
      st = c.AwaitIteration(*pending);
    }
    pending.reset();
    std::lock_guard<std::mutex> lock(job.mu);
    if (!st.ok()) {
      job.SetState(JobState::kFailed, std::string(st.status().message()));
      return false;
    }
    ++steps;
    ++job.steps_done;
    job.Emit({JobEvent::Kind::kIteration, job.state, *st, ""});
    const int64_t step = job.first_step + job.steps_done;
    skipped_in_a_row = st->skipped_step ? skipped_in_a_row + 1 : 0;
    if (st->skipped_step && (st->loss_scale <= 1.0 || skipped_in_a_row >= kMaxConsecutiveSkippedSteps)) {
      job.SetState(JobState::kFailed,
                   absl::StrCat("training diverged at step ", step, ": ", skipped_in_a_row,
                                " step(s) in a row overflowed in fp16 (loss ", st->loss, ", loss scale ",
                                st->loss_scale, "); lower the learning rate or train in bf16"));
      return false;
    }
    if (!st->skipped_step && !std::isfinite(st->loss)) {
      job.SetState(JobState::kFailed, absl::StrCat("training diverged at step ", step, ": the loss is ", st->loss,
                                                   "; lower the learning rate"));
      return false;
    }
    return true;
  };
  auto end = [&](JobState s, std::string message) {
    if (!finish_pending()) return;  // already FAILED
    {
      std::lock_guard<std::mutex> run(job.run_mu);
      (void)c.Flush();  // the store now holds every step
      // A daemon job's final weights go to disk before it is reported ended: export works after
      // any restart, and the host state can be released (ReleaseEnded).
      if (!job.spec.checkpoint_root.empty()) {
        auto info = job.CheckpointNow("final", /*report_existing=*/false);
        std::lock_guard<std::mutex> lock(job.mu);
        if (info.ok()) job.final_checkpoint = info->path;
      }
    }
    std::lock_guard<std::mutex> lock(job.mu);
    job.SetState(s, std::move(message));
  };
  // Checkpoint requests (served between iterations): report the pending iteration, flush the
  // optimizer (async), write. False when the job failed meanwhile.
  auto take_checkpoints = [&]() -> bool {
    std::deque<Job::CheckpointRequest> reqs;
    {
      std::lock_guard<std::mutex> lock(job.mu);
      if (job.checkpoints.empty()) return true;
      reqs.swap(job.checkpoints);
    }
    const bool ok = finish_pending();
    std::lock_guard<std::mutex> run(job.run_mu);
    if (ok) (void)c.Flush();
    for (auto& r : reqs) {
      if (!ok) {
        if (r.done) r.done->set_value(absl::FailedPreconditionError("the job failed before the checkpoint"));
        continue;
      }
      auto info = job.CheckpointNow(r.note);
      {
        std::lock_guard<std::mutex> lock(job.mu);
        if (!r.done) {  // the policy: a disk that keeps failing pauses the job instead of losing its progress
          job.checkpoint_failures = info.ok() ? 0 : job.checkpoint_failures + 1;
          if (job.checkpoint_failures >= kMaxCheckpointFailures && !job.cancel) {
            job.pause = true;
            job.pause_reason = absl::StrCat("paused after ", job.checkpoint_failures,
                                            " checkpoints in a row failed (last: ", info.status().message(),
                                            "); fix the output directory, then resume");
            job.checkpoint_failures = 0;
          }
        }
      }
      if (r.done) r.done->set_value(info);
    }
    return ok;
  };
  // The checkpoint_every policy: when the steps submitted so far reach a multiple of it, take
  // the checkpoint before submitting more (exactly that many steps, whatever the timing).
  int64_t last_policy_step = job.first_step;
  auto policy_checkpoint = [&] {
    if (job.spec.checkpoint_every <= 0) return;
    const int64_t submitted = job.first_step + steps + (pending ? 1 : 0);
    if (submitted == last_policy_step || submitted % job.spec.checkpoint_every != 0) return;
    last_policy_step = submitted;
    std::lock_guard<std::mutex> lock(job.mu);
    job.checkpoints.push_back({"every " + std::to_string(job.spec.checkpoint_every) + " steps", nullptr});
  };
  // Pause point (between iterations): report the pending iteration, flush the optimizer so the
  // store is consistent, then wait for Resume or Cancel (serving checkpoint requests meanwhile).
  auto maybe_pause = [&]() -> bool {
    {
      std::lock_guard<std::mutex> lock(job.mu);
      if (!job.pause || job.cancel) return true;
    }
    if (!finish_pending()) return false;
    {
      std::lock_guard<std::mutex> run(job.run_mu);
      (void)c.Flush();
    }
    std::unique_lock<std::mutex> lock(job.mu);
    job.SetState(JobState::kPaused, std::exchange(job.pause_reason, ""));
    for (;;) {
      job.cv.wait(lock, [&] { return !job.pause || job.cancel || !job.checkpoints.empty(); });
      if (job.checkpoints.empty()) break;
      lock.unlock();
      if (!take_checkpoints()) return false;
      lock.lock();
    }
    if (!job.cancel) job.SetState(JobState::kRunning);
    return true;
  };
  for (;;) {
    policy_checkpoint();
    if (!take_checkpoints()) return;
    if (!maybe_pause()) return;
    if (job.spec.max_steps > 0 && steps + (pending ? 1 : 0) >= job.spec.max_steps) {
      end(JobState::kSucceeded, "");
      return;
    }
    TensorBatch batch;
    int64_t data_index = -1;  // token-file jobs: the batch's index in the file
    if (job.data) {
      std::unique_lock<std::mutex> lock(job.mu);
      if ((job.pause || !job.checkpoints.empty()) && !job.cancel) continue;
      const int64_t index = job.consumed_offset + job.consumed;
      if (job.cancel || index >= job.data->batches_per_epoch() * job.spec.token_file->max_epochs) {
        const bool cancelled = job.cancel;
        lock.unlock();
        end(cancelled ? JobState::kCancelled : JobState::kSucceeded, cancelled ? "cancelled" : "");
        return;
      }
      ++job.consumed;
      lock.unlock();
      auto [tokens, labels] = job.data->Batch(index);
      batch = {tokens, labels};
      data_index = index;
    } else {
      std::unique_lock<std::mutex> lock(job.mu);
      const bool idle = job.batches.empty() && !job.cancel && !job.input_closed;
      if (idle && pending) {
        // Nothing to overlap with: report the pending iteration now instead of holding it.
        lock.unlock();
        if (!finish_pending()) return;
        continue;
      }
      job.cv.wait(lock, [&] {
        return job.cancel || job.pause || job.input_closed || !job.batches.empty() || !job.checkpoints.empty();
      });
      if ((job.pause || !job.checkpoints.empty()) && !job.cancel) continue;
      if (job.cancel || job.batches.empty()) {
        const bool cancelled = job.cancel;
        lock.unlock();
        end(cancelled ? JobState::kCancelled : JobState::kSucceeded, cancelled ? "cancelled" : "");
        return;
      }
      batch = std::move(job.batches.front());
      job.batches.pop_front();
      ++job.consumed;
      // Room in the queue: the oldest waiting asynchronous feed takes it.
      std::function<void(absl::Status)> admitted;
      if (!job.waiting.empty()) {
        job.batches.push_back(std::move(job.waiting.front().batch));
        admitted = std::move(job.waiting.front().done);
        job.waiting.pop_front();
      }
      job.cv.notify_all();  // room for FeedBatch
      lock.unlock();
      if (admitted) admitted(absl::OkStatus());
    }
    absl::StatusOr<int> it;
    {
      std::lock_guard<std::mutex> run(job.run_mu);
      it = c.SubmitIteration(batch.tokens, batch.labels);
    }
    if (!it.ok()) {
      std::lock_guard<std::mutex> lock(job.mu);
      if (it.status().code() == absl::StatusCode::kInvalidArgument && data_index >= 0) {
        job.SetState(JobState::kFailed, absl::StrCat("token file batch ", data_index, ": ", it.status().message()));
        return;
      }
      if (it.status().code() == absl::StatusCode::kInvalidArgument) {
        job.Emit({JobEvent::Kind::kBatchRejected, job.state, {}, std::string(it.status().message())});
        continue;
      }
      job.SetState(JobState::kFailed, std::string(it.status().message()));
      return;
    }
    // Sync: the iteration is complete already. Async: keep it in flight while the next one is
    // submitted, then report the older one.
    if (!finish_pending()) return;
    pending = *it;
    if (job.spec.optimizer_mode == planning::OptimizerMode::kSync && !finish_pending()) return;
  }
}

}  // namespace rp::scheduler
