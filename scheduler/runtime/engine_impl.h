// engine_impl.h — (runtime) what stands behind the engine facade: the devices and their compute
// gates, the job table (runtime::EngineJob), the feeds into each job's queue, the queries, and
// the runner threads (engine_runner.cc) that start jobs in priority order, up to
// max_running_jobs side by side, each on its own lanes of every device (lane_device.h), and
// build (job_builder.h) and run (job_runner.h) them. scheduler/engine.h forwards every call
// here; only the runtime and its tests include this header.
//
// Contract: the facade's (every method thread-safe). Locks: `mu_` guards the job table (checked:
// ABSL_GUARDED_BY, deploy/thread-safety.sh); each job's `mu` guards its queue, events and state;
// its `run_mu` is held while an iteration, a checkpoint or a read of the store runs (reads wait
// for the iteration boundary). Order: mu_ before a job's mu; run_mu before mu; never mu_ while
// waiting on a job.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/engine.h"
#include "scheduler/runtime/engine_job.h"
#include "scheduler/runtime/job_builder.h"
#include "workers/base/mutex.h"
#include "workers/device/compute_gate.h"
#include "workers/device/device.h"
#include "workers/device/timeline.h"

namespace rp::scheduler {

class Engine::Impl {
 public:
  static absl::StatusOr<std::unique_ptr<Impl>> Create(const EngineOptions& options);
  ~Impl();

  absl::StatusOr<JobId> Submit(const JobSpec& spec);
  absl::Status FeedBatch(JobId id, Batch batch, std::chrono::milliseconds timeout);
  absl::Status FeedBatchAsync(JobId id, Batch batch, std::function<void(absl::Status)> done);
  absl::Status CloseInput(JobId id);
  absl::Status EndWaitingFeeds(JobId id, const absl::Status& why);
  absl::StatusOr<std::vector<JobEvent>> AwaitEvents(JobId id, std::chrono::milliseconds timeout);
  absl::Status Cancel(JobId id);
  absl::Status Pause(JobId id);
  absl::Status Resume(JobId id);
  absl::StatusOr<JobInfo> Info(JobId id) const;
  absl::StatusOr<spec::ModelConfig> ModelConfig(JobId id) const;
  absl::StatusOr<std::vector<ParameterShape>> ParameterShapes(JobId id) const;
  absl::StatusOr<TensorValue> Parameter(JobId id, const std::string& name) const;
  absl::StatusOr<CheckpointInfo> Checkpoint(JobId id, const std::string& note);
  absl::StatusOr<int64_t> Export(JobId id, const std::string& dir, ExportKind kind, const StopCheck& stop);
  // engine_generate.cc: Engine::Generate.
  absl::StatusOr<std::vector<GeneratedSample>> Generate(const JobSpec& spec, const EvalPolicy::Samples& request,
                                                        const StopCheck& stop);
  EngineStats Stats() const;
  // engine_workers.cc: the pool's workers in and out (Engine::DrainWorker, EnableWorker).
  absl::Status DrainWorker(int worker, bool now);
  absl::Status EnableWorker(int worker);
  const workers::Timeline& timeline() const { return timeline_; }
  void Shutdown();

  using Job = runtime::EngineJob;
  static constexpr int kMaxRunningJobs = 64;

 private:
  Impl() = default;
  // The runner threads (engine_runner.cc): each takes the next job that may start (NextJob),
  // runs it to its end (RunJob) and frees its slot.
  void RunnerLoop();
  std::shared_ptr<Job> NextJob() ABSL_LOCKS_EXCLUDED(mu_);  // null at shutdown
  void RunJob(const std::shared_ptr<Job>& job);
  // The job's lanes on every device (made once; freed with its controller, FreeLanes).
  std::vector<workers::Device*> LanesOf(Job& job);
  static void FreeLanes(Job& job);
  void ReleaseEnded(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.run_mu);
  bool StartInterrupted(const std::shared_ptr<Job>& job) ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseData(Job& job);
  std::vector<workers::Device*> RawDevices() const;
  std::shared_ptr<Job> Find(JobId id) const;  // null for generation jobs too (never listed)
  absl::Status CancelJob(const std::shared_ptr<Job>& job);
  // Submit's host memory check of a prepared job (ResourceExhausted when it alone exceeds the limit).
  absl::Status CheckHostLimit(const Job& job) const;
  // What both feeds check first (the job, its kind, its state, the batch), and the batch as tensors.
  absl::StatusOr<std::pair<std::shared_ptr<Job>, runtime::TensorBatch>> AcceptFeed(JobId id, const Batch& batch) const;
  // The queued job that starts next, taken off the queue and counted as running (null: none may
  // start now). `available`: host memory a new job may take (-1: not checked). Every job left
  // waiting is told why (UpdateWaitsLocked).
  std::shared_ptr<Job> TakeRunnableLocked(int64_t available) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The queued job that would start first (priority, then submission order); drops ended ones.
  std::shared_ptr<Job> HeadLocked(size_t* at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `head` cannot start now (cause kNone: it can).
  JobWait HeadWaitLocked(const Job& head, int64_t available) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateWaitsLocked(int64_t available) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  workers::Timeline timeline_;
  std::vector<std::unique_ptr<workers::Device>> devices_;
  std::vector<std::unique_ptr<workers::ComputeGate>> gates_;  // one per device, shared by its lanes
  int max_running_ = 1;
  std::function<int64_t()> host_memory_available_;
  int64_t host_memory_limit_ = 0;  // EngineOptions::host_memory_limit
  std::string comm_binary_;        // EngineOptions::comm_binary
  std::function<std::shared_ptr<spec::RendezvousStore>(const DataParallelSpec&)> rendezvous_store_;  // EngineOptions
  // What the running jobs' model states hold against host_memory_limit_.
  int64_t HeldByRunningLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  base::Mutex workers_mu_;  // orders operators' DrainWorker / EnableWorker calls (no field of its own)
  mutable base::Mutex mu_;
  base::CondVar cv_;  // the runner waits on it for a runnable job
  std::map<JobId, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<JobId> pending_ ABSL_GUARDED_BY(mu_);  // not started yet (queued or paused while queued)
  JobId next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<JobId> running_ ABSL_GUARDED_BY(mu_);  // taken by a runner, not yet finished
  // Generations (Engine::Generate) running on their callers' threads, outside max_running_jobs;
  // their host memory counts like a running job's. Shutdown waits for them to end.
  std::vector<JobId> generating_ ABSL_GUARDED_BY(mu_);
  // Engine::Generate's admission: waits until the job's host memory fits beside the running jobs
  // (as NextJob decides), the job is cancelled, or the engine shuts down (false).
  bool AdmitGeneration(const std::shared_ptr<Job>& job) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::thread> runners_;
};

}  // namespace rp::scheduler
