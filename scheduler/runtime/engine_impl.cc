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
#include "scheduler/runtime/job_builder.h"
#include "scheduler/runtime/job_runner.h"
#include "scheduler/runtime/model_adapter.h"
#include "scheduler/runtime/tensor_batch.h"
#include "scheduler/runtime/token_dataset.h"
#include "workers/files/atomic_dir.h"
#include "workers/files/confined_fs.h"
#include "workers/io/checkpoint.h"
#include "workers/io/hf_config.h"
#include "workers/io/safetensors_reader.h"
#include "workers/models/layers.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler {

namespace {

// A model's parameters in engine order, tied ones once (what a HostModelStore holds).
std::vector<ParameterShape> ParamShapesOf(const spec::ModelConfig& m) {
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

}  // namespace

absl::StatusOr<std::unique_ptr<Engine::Impl>> Engine::Impl::Create(const EngineOptions& options) {
  if (options.max_running_jobs < 1 || options.max_running_jobs > kMaxRunningJobs) {
    return absl::InvalidArgumentError(absl::StrCat("max_running_jobs must be between 1 and ", kMaxRunningJobs, " (got ",
                                                   options.max_running_jobs, ")"));
  }
  std::unique_ptr<Impl> e(new Impl());
  workers::DeviceOptions dopt;
  dopt.keep_weights_resident = options.keep_weights_resident;
  dopt.pinned_slab_bytes = options.pinned_slab_bytes;
  auto devices = workers::CreateDevices(options.devices, &e->timeline_, dopt);  // they record into our timeline
  if (!devices.ok()) return devices.status();
  e->devices_ = std::move(*devices);
  for (size_t d = 0; d < e->devices_.size(); ++d) e->gates_.push_back(std::make_unique<workers::ComputeGate>());
  e->max_running_ = options.max_running_jobs;
  e->host_memory_available_ = options.host_memory_available;
  if (options.host_memory_limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_memory_limit must be 0 (none) or positive (got ", options.host_memory_limit, ")"));
  }
  e->host_memory_limit_ = options.host_memory_limit;
  e->comm_binary_ = options.comm_binary;
  e->rendezvous_store_ = options.rendezvous_store;
  for (int r = 0; r < e->max_running_; ++r) e->runners_.emplace_back([raw = e.get()] { raw->RunnerLoop(); });
  return e;
}

Engine::Impl::~Impl() { Shutdown(); }

std::vector<workers::Device*> Engine::Impl::RawDevices() const {
  std::vector<workers::Device*> out;
  for (const auto& d : devices_) out.push_back(d.get());
  return out;
}

std::shared_ptr<Engine::Impl::Job> Engine::Impl::Find(JobId id) const {
  base::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() || it->second->generation_only ? nullptr : it->second;  // generations: never listed
}

absl::StatusOr<JobId> Engine::Impl::Submit(const JobSpec& spec) {
  // Validation only (runtime/job_builder.h): nothing is allocated or loaded until the runner
  // takes the job, so a queued job costs no host memory and Submit returns at once.
  auto job = std::make_shared<Job>();
  job->comm_binary = comm_binary_;
  if (absl::Status st = runtime::PrepareJob(spec, RawDevices(), job.get()); !st.ok()) return st;
  if (absl::Status st = CheckHostLimit(*job); !st.ok()) return st;
  if (spec.data_parallel && rendezvous_store_) job->rendezvous_store = rendezvous_store_(*spec.data_parallel);
  base::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("engine is shutting down");
  job->id = next_id_++;
  {
    base::MutexLock jl(&job->mu);
    job->SetState(JobState::kQueued);
    if (job->spec.start_paused) {
      job->pause = true;
      job->SetState(JobState::kPaused, "paused before it started");
    }
  }
  jobs_[job->id] = job;
  pending_.push_back(job->id);
  UpdateWaitsLocked(-1);  // says why at once when every runner is busy (memory: the runners' say)
  cv_.SignalAll();
  return job->id;
}

absl::Status Engine::Impl::CheckHostLimit(const Job& job) const {
  if (host_memory_limit_ > 0 && job.AdmissionBytes() > host_memory_limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job: its model states", job.predicted_worker_bytes > 0 ? " and the CPU workers' stage copies" : "", " need ",
        job.AdmissionBytes(), " bytes of host memory, more than the limit of ", host_memory_limit_,
        " bytes all jobs share (DaemonConfig.hostMemoryLimitBytes); raise it or train a smaller "
        "model (LoRA, a lower precision)"));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::Cancel(JobId id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  return CancelJob(job);
}

absl::Status Engine::Impl::CancelJob(const std::shared_ptr<Job>& job) {
  const JobId id = job->id;
  bool never_ran = false;
  {
    base::MutexLock lock(&job->mu);
    if (job->terminal()) return absl::FailedPreconditionError(absl::StrCat("job ", id, " already ended"));
    job->cancel = true;
    job->stop_starting = true;
    if (job->state == JobState::kQueued || (job->state == JobState::kPaused && !job->controller_started)) {
      job->SetState(JobState::kCancelled, "cancelled before it started");
      never_ran = !job->controller_started;  // the runner will never take it
    }
    job->cv.SignalAll();
  }
  if (never_ran) {  // never built, holds no host state; its waiting feeds end here
    std::deque<runtime::WaitingFeed> waiting;
    {
      base::MutexLock lock(&job->mu);
      waiting.swap(job->waiting);
      job->batches.clear();
    }
    for (auto& w : waiting) w.done(absl::FailedPreconditionError(absl::StrCat("job ", id, " was cancelled")));
    ReleaseData(*job);  // a raw token file mapped at Submit
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::Pause(JobId id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  base::MutexLock lock(&job->mu);
  if (job->terminal() || job->cancel) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " already ended"));
  }
  job->pause = true;
  job->stop_starting = true;
  if (job->state == JobState::kQueued) job->SetState(JobState::kPaused, "paused before it started");
  job->cv.SignalAll();
  return absl::OkStatus();
}

absl::Status Engine::Impl::Resume(JobId id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  {
    base::MutexLock lock(&job->mu);
    if (job->terminal() || job->cancel) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, " already ended"));
    }
    job->pause = false;
    job->stop_starting = false;
    if (job->state == JobState::kPaused && !job->controller_started) job->SetState(JobState::kQueued);
    job->cv.SignalAll();
  }
  {
    base::MutexLock lock(&mu_);
    UpdateWaitsLocked(-1);
  }
  cv_.SignalAll();  // a job paused while queued may start now
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ParameterShape>> Engine::Impl::ParameterShapes(JobId id) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  base::MutexLock run(&job->run_mu);
  if (!job->store && !job->final_shapes.empty()) return job->final_shapes;
  if (!job->store) return ParamShapesOf(job->model);  // not built yet (or cancelled before)
  std::vector<ParameterShape> out;
  for (int i = 0; i < job->store->num_params(); ++i)
    out.push_back({job->store->param(i).name, job->store->param(i).shape});
  return out;
}

absl::StatusOr<CheckpointInfo> Engine::Impl::Checkpoint(JobId id, const std::string& note) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::future<absl::StatusOr<CheckpointInfo>> result;
  {
    base::MutexLock lock(&job->mu);
    if (!job->controller_started) {
      return absl::FailedPreconditionError("the job has not started; nothing to checkpoint");
    }
    if (!job->terminal()) {
      auto promise = std::make_shared<std::promise<absl::StatusOr<CheckpointInfo>>>();
      result = promise->get_future();
      job->checkpoints.push_back({note, promise});
      job->cv.SignalAll();
    }
  }
  if (result.valid()) return result.get();
  // Ended: the store holds the final weights (the runner flushed) and nothing runs any more.
  base::MutexLock run(&job->run_mu);
  int64_t step, consumed;
  {
    base::MutexLock lock(&job->mu);
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

absl::StatusOr<spec::ModelConfig> Engine::Impl::ModelConfig(JobId id) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  base::MutexLock run(&job->run_mu);
  spec::ModelConfig m = job->store ? job->store->config() : job->model;
  m.name = job->spec.model.name;
  return m;
}

absl::StatusOr<JobInfo> Engine::Impl::Info(JobId id) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  base::MutexLock lock(&job->mu);
  JobInfo info;
  info.state = job->state;
  info.message = job->message;
  info.steps_done = job->first_step + job->steps_done;
  info.batches_consumed = job->consumed_offset + job->consumed;
  info.queued_batches = static_cast<int>(job->batches.size() + job->waiting.size());
  info.total_steps = job->spec.max_steps > 0 ? job->first_step + job->spec.max_steps : 0;
  const int64_t data_steps =
      job->data ? job->data->batches_per_epoch() * job->spec.token_file->max_epochs : job->data_steps;
  if (data_steps > 0) info.total_steps = info.total_steps > 0 ? std::min(info.total_steps, data_steps) : data_steps;
  info.last_eval = job->last_eval;
  info.resumed_after_its_evaluation = job->resumed_after_its_evaluation;
  info.best_checkpoint = job->best_checkpoint;
  info.profile = job->profile_written;
  info.predicted_host_state_bytes = job->predicted_host_state_bytes;
  info.predicted_worker_bytes = job->predicted_worker_bytes;
  info.peak_host_state_bytes = job->peak_host_state_bytes;
  info.peak_activation_bytes = job->peak_activation_bytes;
  return info;
}

absl::StatusOr<std::vector<JobEvent>> Engine::Impl::AwaitEvents(JobId id, std::chrono::milliseconds timeout) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  base::MutexLock lock(&job->mu);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (job->events.empty()) {
    if (!job->cv.WaitUntil(&job->mu, deadline)) break;
  }
  std::vector<JobEvent> out;
  out.swap(job->events);
  return out;
}

absl::StatusOr<TensorValue> Engine::Impl::Parameter(JobId id, const std::string& name) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  base::MutexLock run(&job->run_mu);
  auto t = job->ReadParameter(name);
  if (!t.ok()) return t.status();
  return ToValue(*t);
}

absl::StatusOr<int64_t> Engine::Impl::Export(JobId id, const std::string& dir, ExportKind kind, const StopCheck& stop) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  base::MutexLock run(&job->run_mu);  // a consistent state: between iterations, or final
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
      dir, job->model, shapes,
      [&job](const std::string& name) {
        job->run_mu.AssumeHeld();  // called by ExportJob, inside this function's run_mu
        return job->ReadParameter(name);
      },
      job->dtype, kind, stop);
}

EngineStats Engine::Impl::Stats() const {
  EngineStats s;
  for (const auto& d : devices_) {
    DeviceStats& ds = s.devices.emplace_back();
    ds.name = d->name();
    ds.description = d->description();
    workers::DeviceHealth& h = d->health();
    ds.state = h.lost()      ? DeviceStats::State::kLost
               : h.drained() ? DeviceStats::State::kDrained
                             : DeviceStats::State::kUp;
    if (h.lost()) ds.lost_reason = std::string(h.why().message());
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
  base::MutexLock lock(&mu_);
  s.max_running_jobs = max_running_;
  for (JobId id : running_) {
    const std::shared_ptr<Job>& job = jobs_.at(id);
    EngineStats::RunningJob r{id, job->spec.share, 0, std::vector<double>(devices_.size(), 0.0)};
    base::MutexLock jl(&job->mu);
    for (const auto& [device, lane] : job->gate_lanes) {
      const double used = gates_[device]->used_seconds(lane);
      r.compute_seconds += used;
      r.worker_compute_seconds[static_cast<size_t>(device)] += used;
    }
    s.running.push_back(r);
  }
  for (const auto& [id, job] : jobs_) {
    base::MutexLock jl(&job->mu);
    if (!job->generation_only) {  // never listed; its host state counts below
      ++s.jobs_total;
      if (!job->terminal()) ++s.jobs_active;
    }
    if (job->state == JobState::kRunning && job->store) {  // the running jobs' host state, summed
      s.host_model_bytes += job->store->HostBytes();
      s.host_mapped_bytes += job->store->MappedBytes();
      s.host_registered_bytes += job->store->RegisteredBytes();
      if (job->controller) {
        s.host_optimizer_bytes += job->controller->OptimizerStateBytes();
        s.host_activation_bytes += job->controller->activations().live_bytes();
      }
    }
  }
  return s;
}

// A daemon job (it has a checkpoint root) costs host memory only while it runs: once it ended
// (its final checkpoint was written before the terminal state, see JobRunner::End), the store and the
// controller are freed; export, Parameter and Checkpoint read the final checkpoint. A failed
// job's state is not consistent: it is freed at once. Without a root (library use) or when the
// final checkpoint could not be written, the store stays. Caller holds run_mu.
void Engine::Impl::ReleaseEnded(Job& job) {
  if (!job.store) return;
  if (job.generation_only) {  // nothing of it is kept
    base::MutexLock lock(&job.mu);
    job.controller.reset();
    job.store.reset();
    return;
  }
  if (job.spec.checkpoint_root.empty()) return;
  {
    base::MutexLock lock(&job.mu);
    if (!IsTerminal(job.state)) return;
    if (job.state != JobState::kFailed && job.final_checkpoint.empty()) return;  // keep: nothing on disk
  }
  job.final_shapes = ParamShapesOf(job.store->config());
  base::MutexLock lock(&job.mu);
  job.controller.reset();
  job.store.reset();
}

}  // namespace rp::scheduler
