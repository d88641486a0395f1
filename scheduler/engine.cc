#include "scheduler/engine.h"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/cost_model.h"
#include "workers/io/atomic_dir.h"
#include "workers/io/checkpoint.h"
#include "workers/io/confined_fs.h"
#include "workers/io/hf_config.h"
#include "workers/io/safetensors_reader.h"
#include "workers/models/layers.h"

namespace rp::scheduler {

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kPaused:
      return "PAUSED";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "?";
}

bool IsTerminal(JobState s) { return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled; }

struct Engine::Job {
  JobId id = 0;
  JobSpec spec;
  // The job's host state. Both are released (reset under run_mu and mu) once a daemon job has
  // ended and its final state is on disk; readers hold run_mu or copy the pointers under mu.
  std::shared_ptr<workers::HostModelStore> store;  // null until the runner builds the job
  std::shared_ptr<Controller> controller;
  ControllerOptions controller_options;  // decided at Submit, used by BuildJob
  std::mutex run_mu;                     // held while an iteration runs (Parameter reads wait for it)
  // After the release: where the final weights are, and what export needs to know of them.
  std::string final_checkpoint;
  std::vector<std::pair<std::string, std::vector<int64_t>>> final_shapes;
  workers::models::TransformerConfig final_config;
  std::unique_ptr<workers::io::SafetensorsFile> final_weights;  // opened on first Parameter() (run_mu)

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Batch> batches;
  bool input_closed = false;
  bool cancel = false;
  bool pause = false;               // requested; honoured between iterations
  bool controller_started = false;  // the runner took the job (guarded by mu)
  JobState state = JobState::kQueued;
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
  void Emit(JobEvent e) {  // caller holds mu
    e.time = std::chrono::system_clock::now();
    events.push_back(std::move(e));
    cv.notify_all();
  }
  void SetState(JobState s, std::string message = "") {  // caller holds mu
    state = s;
    Emit({JobEvent::Kind::kState, s, {}, std::move(message)});
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

absl::StatusOr<planning::Partition> PlanFromParameterSizes(const workers::models::TransformerConfig& model,
                                                           int num_workers, int microbatches) {
  planning::CostModel costs;
  for (int l = 0; l < model.num_layers(); ++l) {
    int64_t params = 0;
    for (const auto& spec : workers::models::LayerParams(model, l)) {
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      params += n;
    }
    planning::LayerCost c;
    // The embedding is a lookup, not a matmul: count it as one row per token, i.e. cheap.
    const double work = l == 0 ? static_cast<double>(model.hidden) : static_cast<double>(params);
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
// A model's parameters (name, shape) in engine order, tied ones once (what a HostModelStore holds).
std::vector<std::pair<std::string, std::vector<int64_t>>> ParamShapesOf(const workers::models::TransformerConfig& m) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& p : workers::models::ModelParams(m)) out.emplace_back(p.name, p.shape);
  return out;
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

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  auto devices =
      workers::CreateDevices(options.devices, &e->timeline_, options.device_options);  // they record into our timeline
  if (!devices.ok()) return devices.status();
  e->devices_ = std::move(*devices);
  e->runner_ = std::thread([raw = e.get()] { raw->RunnerLoop(); });
  return e;
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
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
    std::lock_guard<std::mutex> jl(job->mu);
    if (!job->terminal()) job->SetState(JobState::kCancelled, "engine shut down");
  }
}

std::shared_ptr<Engine::Job> Engine::Find(JobId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

absl::StatusOr<JobId> Engine::Submit(const JobSpec& spec_in) {
  // Validation only: the files a job names are checked (headers, checksums) but nothing is
  // allocated or loaded until the runner takes the job (BuildJob), so a queued job costs no host
  // memory and Submit returns at once.
  JobSpec spec = spec_in;
  if (absl::Status st = spec.model.Validate(); !st.ok()) return st;
  if (spec.master_dtype != at::kFloat && spec.master_dtype != at::kBFloat16 && spec.master_dtype != at::kHalf) {
    return absl::InvalidArgumentError("job: master dtype must be float32, bfloat16 or float16");
  }
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
  if (!spec.hf_dir.empty()) {
    if (absl::Status st = workers::io::CheckHfWeights(spec.hf_dir, spec.model); !st.ok()) return st;
  }
  if (!spec.lora_adapter_dir.empty()) {
    if (spec.model.lora.rank <= 0) return absl::InvalidArgumentError("job: an adapter dir needs a LoRA model");
    if (absl::Status st = workers::io::CheckPeftAdapter(spec.lora_adapter_dir, spec.model); !st.ok()) return st;
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
  ControllerOptions& o = job->controller_options;
  if (spec.partition) o.partition = *spec.partition;
  o.microbatches = spec.microbatches;
  o.microbatches_per_round = spec.microbatches_per_round;
  o.adamw = spec.adamw;
  o.lr_schedule = spec.lr_schedule;
  o.loss_scaler.enabled = spec.master_dtype == at::kHalf;
  o.mode = spec.optimizer_mode;
  o.auto_partition = spec.auto_partition;
  {
    std::vector<workers::Device*> raw_devices;
    for (auto& d : devices_) raw_devices.push_back(d.get());
    o.stage_memory_cap = spec.stage_memory_cap > 0 ? spec.stage_memory_cap : DefaultStageMemoryCap(raw_devices);
  }
  if (absl::Status st = Controller::ValidateOptions(o, spec.model, N); !st.ok()) return st;
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

absl::Status Engine::BuildJob(Job& job) {
  const JobSpec& spec = job.spec;
  std::shared_ptr<workers::HostModelStore> store;
  try {
    store = std::make_shared<workers::HostModelStore>(spec.model, spec.master_dtype, spec.seed);
    if (devices_.front()->torch_device().is_cuda()) {
      // Masters in pinned memory: weight uploads become asynchronous DMA (paper §4.2).
      store->RelocateMasters(
          [d = devices_.front().get()](at::IntArrayRef sizes, at::ScalarType dt) { return d->EmptyHost(sizes, dt); });
    }
  } catch (const std::exception& ex) {
    return absl::ResourceExhaustedError(absl::StrCat("host memory for the model store: ", ex.what()));
  }
  if (!spec.hf_dir.empty()) {
    if (absl::Status st = workers::io::LoadHfWeights(spec.hf_dir, store.get()); !st.ok()) return st;
  }
  if (!spec.lora_adapter_dir.empty()) {
    if (absl::Status st = workers::io::LoadPeftAdapter(spec.lora_adapter_dir, store.get()); !st.ok()) return st;
  }
  ControllerOptions o = job.controller_options;
  if (!spec.resume_from.empty()) {
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

absl::Status Engine::FeedBatch(JobId id, Batch batch, std::chrono::milliseconds timeout) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->terminal()) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " accepts no more batches (", JobStateName(job->state), ")"));
    }
  }
  // Against the spec (vocab, micro-batches): a queued job has no controller yet.
  if (absl::Status st =
          Controller::ValidateBatchFor(job->spec.model.vocab, job->spec.microbatches, batch.tokens, batch.labels);
      !st.ok()) {
    return st;
  }
  std::unique_lock<std::mutex> lock(job->mu);
  const bool room = job->cv.wait_for(lock, timeout, [&] {
    return job->cancel || job->input_closed || job->terminal() ||
           static_cast<int>(job->batches.size()) < job->spec.max_queued_batches;
  });
  if (job->input_closed || job->terminal() || job->cancel) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " accepts no more batches (", JobStateName(job->state), ")"));
  }
  if (!room) {
    return absl::DeadlineExceededError(
        absl::StrCat("job ", id, ": batch queue still full after ", timeout.count(), " ms"));
  }
  job->batches.push_back(std::move(batch));
  job->cv.notify_all();
  return absl::OkStatus();
}

absl::Status Engine::CloseInput(JobId id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> lock(job->mu);
  job->input_closed = true;
  job->cv.notify_all();
  return absl::OkStatus();
}

absl::Status Engine::Cancel(JobId id) {
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
  (void)never_ran;  // a job that never ran was never built: it holds no host state
  return absl::OkStatus();
}

absl::Status Engine::Pause(JobId id) {
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

absl::Status Engine::Resume(JobId id) {
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

absl::StatusOr<std::vector<std::pair<std::string, std::vector<int64_t>>>> Engine::ParameterShapes(JobId id) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> run(job->run_mu);
  if (!job->store && !job->final_shapes.empty()) return job->final_shapes;
  if (!job->store) return ParamShapesOf(job->spec.model);  // not built yet (or cancelled before)
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (int i = 0; i < job->store->num_params(); ++i) {
    out.emplace_back(job->store->param(i).name, job->store->param(i).shape);
  }
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

absl::StatusOr<CheckpointInfo> Engine::Job::CheckpointNow(const std::string& note, bool report_existing) {
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

absl::StatusOr<CheckpointInfo> Engine::Checkpoint(JobId id, const std::string& note) {
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

absl::StatusOr<workers::models::TransformerConfig> Engine::ModelConfig(JobId id) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> run(job->run_mu);
  if (job->store) return job->store->config();
  return job->final_checkpoint.empty() ? job->spec.model : job->final_config;
}

absl::StatusOr<JobState> Engine::State(JobId id) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> lock(job->mu);
  return job->state;
}

absl::StatusOr<std::vector<JobEvent>> Engine::AwaitEvents(JobId id, std::chrono::milliseconds timeout) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait_for(lock, timeout, [&] { return !job->events.empty(); });
  std::vector<JobEvent> out;
  out.swap(job->events);
  return out;
}

absl::StatusOr<at::Tensor> Engine::Parameter(JobId id, const std::string& name) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::lock_guard<std::mutex> run(job->run_mu);
  if (!job->store) {  // not built yet, or released: read the final checkpoint
    if (job->final_checkpoint.empty()) {
      std::lock_guard<std::mutex> lock(job->mu);
      if (!job->terminal()) {
        return absl::FailedPreconditionError(absl::StrCat("job ", id, " has not started; its weights are not loaded"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " ended without weights to keep (it failed, or was cancelled before it started)"));
    }
    if (!job->final_weights) {
      auto f = workers::io::SafetensorsFile::Open(job->final_checkpoint + "/weights.safetensors");
      if (!f.ok()) return f.status();
      job->final_weights = std::move(*f);
    }
    if (!job->final_weights->Find(name)) {
      return absl::NotFoundError(absl::StrCat("job ", id, " has no parameter ", name));
    }
    return job->final_weights->Read(name, at::kFloat);
  }
  const int i = job->store->FindParam(name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("job ", id, " has no parameter ", name));
  const workers::HostParam& p = job->store->param(i);
  return p.fp32.defined() ? p.fp32.clone() : p.master.to(at::kFloat);  // frozen (LoRA base): master only
}

EngineStats Engine::Stats() const {
  EngineStats s;
  for (const auto& d : devices_) {
    s.devices.push_back(d->name());
    s.descriptions.push_back(d->description());
    auto& bytes = s.transfer_bytes.emplace_back();
    for (int k = 0; k < workers::kNumStreamKinds; ++k) bytes[k] = d->TransferBytes(static_cast<workers::StreamKind>(k));
    s.memory.push_back(d->Memory());
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

void Engine::RunnerLoop() {
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
    // Checkpoint requests that raced with the end of the job: the store is final now.
    std::deque<Job::CheckpointRequest> reqs;
    JobState state;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      reqs.swap(job->checkpoints);
      state = job->state;
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
void Engine::ReleaseEnded(Job& job) {
  if (!job.store || job.spec.checkpoint_root.empty()) return;
  {
    std::lock_guard<std::mutex> lock(job.mu);
    if (!IsTerminal(job.state)) return;
    if (job.state != JobState::kFailed && job.final_checkpoint.empty()) return;  // keep: nothing on disk
  }
  job.final_config = job.store->config();
  job.final_shapes = ParamShapesOf(job.final_config);
  std::lock_guard<std::mutex> lock(job.mu);
  job.controller.reset();
  job.store.reset();
}

std::shared_ptr<Engine::Job> Engine::TakeRunnableLocked() {
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

void Engine::RunJob(Job& job) {
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
    Batch batch;
    {
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
      job.cv.notify_all();  // room for FeedBatch
    }
    absl::StatusOr<int> it;
    {
      std::lock_guard<std::mutex> run(job.run_mu);
      it = c.SubmitIteration(batch.tokens, batch.labels);
    }
    if (!it.ok()) {
      std::lock_guard<std::mutex> lock(job.mu);
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
