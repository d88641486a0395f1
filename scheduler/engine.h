// engine.h — the engine facade (DESIGN §1): the library API that the daemon, tests and
// benchmarks drive. It owns the devices, and per job the HostModelStore and the Controller.
//
//   auto engine = Engine::Create({.devices = "cpu:3"});
//   JobId id = *engine->Submit(spec);
//   engine->FeedBatch(id, {tokens});        // bounded queue: blocks up to a timeout
//   engine->CloseInput(id);                  // the job ends once the queue is drained
//   for (;;) { auto ev = engine->AwaitEvents(id, 1s); for (auto& e : *ev) ... }  // (named: no dangling)
//
// Contract: every method is thread-safe. Jobs run one at a time in submission order on all
// devices (the door to sharing the workers stays open: jobs only meet in the runner). Bad input
// returns a Status and never disturbs a running job. Shutdown (or destruction) cancels queued
// and running jobs and joins the runner.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/controller.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/partition.h"
#include "workers/device/device.h"
#include "workers/device/timeline.h"
#include "workers/models/transformer_config.h"

namespace rp::scheduler {

using JobId = int64_t;

struct EngineOptions {
  std::string devices = "cpu:1";  // "cpu:N", "cuda", "cuda:0,1" (workers/device/device.h)
  workers::DeviceOptions device_options;
};

struct JobSpec {
  std::string name;
  workers::models::TransformerConfig model;
  at::ScalarType master_dtype = at::kFloat;  // kFloat, kBFloat16 or kHalf
  uint64_t seed = 0;                         // weight initialisation
  std::string hf_dir;                        // non-empty: initial weights from this Hugging Face model directory
  // Non-empty: continue from this training checkpoint (weights, optimizer, step, partition);
  // max_steps then counts the steps of this run.
  std::string resume_from;
  // LoRA jobs (model.lora.rank > 0): initial adapters from this PEFT directory (default: A
  // random, B zero).
  std::string lora_adapter_dir;
  // Checkpoint policy: every `checkpoint_every` optimizer steps (counted from the start of the
  // job, resumed steps included) the runner writes `<checkpoint_root>/step-<N>` holding exactly
  // N steps — a deterministic point, so an async job's trajectory does not depend on timing —
  // and keeps the newest `checkpoint_keep_last`. Checkpoint() writes there too.
  int64_t checkpoint_every = 0;
  std::string checkpoint_root;
  int checkpoint_keep_last = 3;
  std::optional<planning::Partition> partition;  // default: planned from parameter sizes
  bool auto_partition = false;                   // profile one layer per slot, then plan from measured times
  // Per-stage device memory for the automatic partition; 0 = derived from the GPUs (see
  // DefaultStageMemoryCap), none on the CPU backend.
  int64_t stage_memory_cap = 0;
  int microbatches = 0;  // 0 = number of devices
  int microbatches_per_round = 0;
  workers::AdamWOptions adamw;
  workers::LrSchedule lr_schedule;
  // kAsync: staleness-1 asynchronous optimizer; consecutive batches overlap (no flush).
  planning::OptimizerMode optimizer_mode = planning::OptimizerMode::kSync;
  int64_t max_steps = 0;       // 0 = until the input is closed
  int max_queued_batches = 4;  // FeedBatch blocks while this many wait
  int priority = 0;            // higher runs first; FIFO (submission order) among equals
};

enum class JobState { kQueued, kRunning, kPaused, kSucceeded, kFailed, kCancelled };
bool IsTerminal(JobState s);
const char* JobStateName(JobState s);

struct CheckpointInfo {
  std::string path;
  int64_t step = 0;              // optimizer steps the checkpoint holds
  int64_t batches_consumed = 0;  // the job's data cursor at that point
};

struct JobEvent {
  // kCheckpointFailed: a checkpoint (policy or requested) could not be written; `message` says
  // why. After kMaxCheckpointFailures policy failures in a row the job pauses.
  enum class Kind { kState, kIteration, kBatchRejected, kCheckpoint, kCheckpointFailed } kind = Kind::kState;
  JobState state = JobState::kQueued;
  IterationStats stats;                        // kIteration
  std::string message;                         // kState (failure reason), kBatchRejected, kCheckpointFailed
  std::chrono::system_clock::time_point time;  // when the engine emitted it
  CheckpointInfo checkpoint;                   // kCheckpoint
};

// Failure policies of the runner (both optimizer modes):
//  - a job whose checkpoint policy failed this many times in a row pauses (fix the disk, resume);
//  - fp16: a job fails when a step overflows with the loss scale at its floor (1), or when this
//    many steps in a row overflowed (it diverged; skipping forever would report success);
//  - any precision: a step whose loss is not finite fails the job, naming the step.
inline constexpr int kMaxCheckpointFailures = 3;
inline constexpr int kMaxConsecutiveSkippedSteps = 32;

struct Batch {
  at::Tensor tokens;
  std::optional<at::Tensor> labels;
};

struct EngineStats {
  std::vector<std::string> devices;
  std::vector<std::string> descriptions;  // per device, e.g. the GPU model
  int jobs_total = 0;
  int jobs_active = 0;
  int64_t host_model_bytes = 0;  // of the running job
  // Bytes copied host<->device per device, indexed by workers::StreamKind.
  std::vector<std::array<int64_t, workers::kNumStreamKinds>> transfer_bytes;
  // Per device: GPU memory of its card and the engine's pinned host arena (zeros on CPU).
  std::vector<workers::Device::MemoryStats> memory;
};

// 90 % of the smallest per-worker share of GPU memory (a GPU's memory divided among the workers
// that share it), halved because one stage is prefetched while one runs; 0 when any device has
// no memory figure (CPU).
int64_t DefaultStageMemoryCap(const std::vector<workers::Device*>& devices);

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();

  absl::StatusOr<JobId> Submit(const JobSpec& spec);
  // Validates the batch at once (InvalidArgument), then queues it; DeadlineExceeded when the
  // queue stays full for `timeout`; FailedPrecondition once the job's input is closed or the
  // job has ended.
  absl::Status FeedBatch(JobId id, Batch batch, std::chrono::milliseconds timeout = std::chrono::seconds(30));
  absl::Status CloseInput(JobId id);
  // Events since the previous call; waits up to `timeout` for at least one.
  absl::StatusOr<std::vector<JobEvent>> AwaitEvents(JobId id, std::chrono::milliseconds timeout);
  absl::Status Cancel(JobId id);
  // Pause: a queued job is held back (others may start); a running job stops at the next
  // iteration boundary with its optimizer flushed and keeps the workers until resumed (one
  // running job at a time). Resume undoes either. FailedPrecondition for ended jobs.
  absl::Status Pause(JobId id);
  absl::Status Resume(JobId id);
  // Names and shapes of the job's parameters in engine order (export walks them with Parameter()).
  absl::StatusOr<std::vector<std::pair<std::string, std::vector<int64_t>>>> ParameterShapes(JobId id) const;
  absl::StatusOr<workers::models::TransformerConfig> ModelConfig(JobId id) const;
  // Writes a training checkpoint of a started job into <checkpoint_root>/step-<N> at the next
  // iteration boundary — async jobs flush their optimizer there, which a deterministic
  // trajectory does not expect (prefer the checkpoint_every policy) — and returns what it holds.
  // Blocks until written; FailedPrecondition for a job that has not started or has no root.
  absl::StatusOr<CheckpointInfo> Checkpoint(JobId id, const std::string& note = "");
  absl::StatusOr<JobState> State(JobId id) const;
  // The fp32 value of a parameter of a job (for tests, export and inspection). Consistent once
  // the job has ended (the engine flushes the optimizer then) or, in sync mode, between
  // iterations; during an async job it may show a step in progress.
  absl::StatusOr<at::Tensor> Parameter(JobId id, const std::string& name) const;
  EngineStats Stats() const;
  workers::Timeline& timeline() { return timeline_; }
  void Shutdown();

 private:
  struct Job;
  Engine() = default;
  void RunnerLoop();
  void RunJob(Job& job);
  void ReleaseEnded(Job& job);
  absl::Status BuildJob(Job& job);  // runner thread, run_mu held: allocate and load the job's host state
  std::shared_ptr<Job> Find(JobId id) const;
  std::shared_ptr<Job> TakeRunnableLocked();  // highest priority queued job, or null (mu_ held)

  workers::Timeline timeline_;
  std::vector<std::unique_ptr<workers::Device>> devices_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<JobId, std::shared_ptr<Job>> jobs_;
  std::vector<JobId> pending_;  // not started yet (queued or paused while queued)
  JobId next_id_ = 1;
  bool shutdown_ = false;
  std::thread runner_;
};

// Default partition when a job names none: AutoPartition over a cost model in which parameter
// counts stand in for time (DESIGN §9), until measured times exist (the next issue).
absl::StatusOr<planning::Partition> PlanFromParameterSizes(const workers::models::TransformerConfig& model,
                                                           int num_workers, int microbatches);

}  // namespace rp::scheduler
