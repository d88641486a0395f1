// engine.h — the engine facade (ARCHITECTURE §1): the library API that the daemon, the tools, tests
// and benchmarks drive. It owns the devices and, per job while it runs, the HostModelStore and
// the Controller. Everything crossing it is a value type (scheduler/engine_types.h); the
// implementation (scheduler/runtime/, LibTorch, workers/) sits behind a pimpl and is linked
// privately, so users compile without LibTorch or the data plane's headers.
//
//   auto engine = Engine::Create({.devices = "cpu:3"});
//   JobId id = *engine->Submit(spec);          // validates only: nothing is allocated yet
//   engine->FeedBatch(id, batch, 30s);          // bounded per-job queue
//   engine->CloseInput(id);                     // the job ends once the queue is drained
//   for (;;) { auto ev = engine->AwaitEvents(id, 1s); ... }
//
// Contract: every method is thread-safe and none waits for training unless it says so. Jobs run
// one at a time in priority, then submission order, on all devices. Bad input returns a Status
// (InvalidArgument naming the field) and never disturbs a running job; broken invariants inside
// the engine fail the job they belong to, never the process. Shutdown (or destruction) cancels
// queued and running jobs and joins the runner.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"
#include "workers/spec/rendezvous_store.h"

namespace rp::scheduler {

struct EngineOptions {
  std::string devices = "cpu:1";  // "cpu:N", "cuda", "cuda:0,1" (a GPU listed k times gets k workers)
  // Benchmarks only (CUDA): upload each master tensor once and keep it (stale weights).
  bool keep_weights_resident = false;
  int64_t pinned_slab_bytes = int64_t{256} << 20;  // pinned host memory comes in slabs of this size (CUDA)
  // Jobs that run side by side on the workers (each on its own lanes; the devices' compute
  // shared by JobSpec::share). 1: one after another.
  int max_running_jobs = 1;
  // Host memory a job about to start may take now (bytes), beyond what running jobs hold: a job
  // whose predicted model states exceed it waits while other jobs run (one always starts when
  // nothing runs). Null: no check. Called with no engine lock held, from the runner threads.
  std::function<int64_t()> host_memory_available;
  // The most host memory the running jobs' model states may take together (bytes; 0: no limit
  // beyond the host's): a job starts only while its predicted states fit in what the running
  // jobs leave of it (each counted at its prediction or at what it measurably held, whichever is
  // more), and a job that alone exceeds it is refused at Submit (RESOURCE_EXHAUSTED).
  int64_t host_memory_limit = 0;
  // Data-parallel jobs: the communicator binary (roundpipe-comm); empty: beside the running
  // executable, or $RP_COMM_BINARY.
  std::string comm_binary;
  // Data-parallel jobs: the store where the job's nodes meet (called once per job, when it
  // starts, with the job's DataParallelSpec; the daemon's cluster answers with its own store on
  // the coordinator and a client of the coordinator's on a peer). Null, or a null answer: one
  // store of this process (nodes that are engines of one process).
  std::function<std::shared_ptr<spec::RendezvousStore>(const DataParallelSpec&)> rendezvous_store;
};

class Engine {
 public:
  // InvalidArgument for a malformed device spec; FailedPrecondition when CUDA is asked for and
  // no (or not the listed) GPU is visible.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks the spec (model, partition, round structure, the files it names: headers, checksums,
  // shapes) and queues the job; allocates nothing and loads nothing (the runner builds the job
  // when it starts it). InvalidArgument / NotFound / FailedPrecondition naming what to fix.
  absl::StatusOr<JobId> Submit(const JobSpec& spec);
  // Streamed jobs. Validates the batch at once (InvalidArgument), then queues it, waiting up to
  // `timeout` for room in the job's queue (DeadlineExceeded); FailedPrecondition once the job's
  // input is closed or the job ended, or when it reads a token file.
  absl::Status FeedBatch(JobId id, Batch batch, std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // The same without waiting: `done` runs exactly once — at once (invalid, ended) or from the
  // runner thread when the batch entered the queue or can never enter it. At most
  // max_queued_batches may wait for room beyond the queue (over all callers of the job);
  // beyond that ResourceExhausted is returned (and `done` is not run).
  absl::Status FeedBatchAsync(JobId id, Batch batch, std::function<void(absl::Status)> done);
  absl::Status CloseInput(JobId id);
  // Ends every feed of the job still waiting for room with `why` (their `done` runs now); the
  // queued batches stay. A daemon's drain ends pending StreamBatches calls this way.
  absl::Status EndWaitingFeeds(JobId id, const absl::Status& why);
  // Events since the previous call; waits up to `timeout` for at least one.
  absl::StatusOr<std::vector<JobEvent>> AwaitEvents(JobId id, std::chrono::milliseconds timeout);
  absl::Status Cancel(JobId id);
  // Pause: a queued job is held back (others may start); a running job stops at the next
  // iteration boundary with its optimizer flushed and keeps the workers until resumed (one
  // running job at a time). Resume undoes either. FailedPrecondition for ended jobs.
  absl::Status Pause(JobId id);
  absl::Status Resume(JobId id);
  absl::StatusOr<JobInfo> Info(JobId id) const;
  absl::StatusOr<JobState> State(JobId id) const;
  // The job's model as it trains (after the engine's own defaults).
  absl::StatusOr<spec::ModelConfig> ModelConfig(JobId id) const;
  // Names and shapes of the job's parameters in engine order (tied ones once).
  absl::StatusOr<std::vector<ParameterShape>> ParameterShapes(JobId id) const;
  // The fp32 value of a parameter. Consistent once the job has ended (the engine flushes the
  // optimizer then; a released job's value comes from its final checkpoint) or, in sync mode,
  // between iterations; during an async job it may show a step in progress.
  absl::StatusOr<TensorValue> Parameter(JobId id, const std::string& name) const;
  // Writes a training checkpoint of a started job into <checkpoint_root>/step-<N> at the next
  // iteration boundary — async jobs flush their optimizer there, which a deterministic
  // trajectory does not expect (prefer the checkpoint_every policy) — and returns what it holds.
  // Blocks until written; FailedPrecondition for a job that has not started or has no root.
  absl::StatusOr<CheckpointInfo> Checkpoint(JobId id, const std::string& note = "");
  // Writes the job's weights to `dir` (which must not exist) in `kind`'s format and returns the
  // bytes written. Waits for an iteration boundary of a running job. `stop` (optional) is polled
  // before each tensor: its error ends the export, nothing left behind.
  absl::StatusOr<int64_t> Export(JobId id, const std::string& dir, ExportKind kind, const StopCheck& stop = {});
  // Completions of `request`'s prompts from the weights `spec` starts from — spec.resume_from
  // (a checkpoint: a finished job's final one), else spec.hf_dir, else the seed — generated
  // through the pipeline on the workers (runtime/generate.h). The spec is admitted like a job
  // (checked as Submit checks it, its host memory predicted and waited for, ahead of queued jobs
  // of lower priority, beside running ones up to max_running_jobs), built, generates, and is
  // freed before this returns; it is never listed among the jobs. Its data, evaluation,
  // checkpoint and profile fields are ignored. Blocks until done. `stop` (optional) is polled
  // while it waits and between tokens: its error cancels the generation and is returned.
  absl::StatusOr<std::vector<GeneratedSample>> Generate(const JobSpec& spec, const EvalPolicy::Samples& request,
                                                        const StopCheck& stop = {});
  EngineStats Stats() const;
  // The workers (EngineStats::devices, by index) in and out of the pool. DrainWorker: no job plans
  // new stage slots on it from its next iteration on; what is queued there finishes (a graceful
  // exit). `now`: as if the device were lost — what is queued or running there is dropped and
  // re-run on the other workers at once (a card that misbehaves). EnableWorker puts a drained or
  // lost worker back (jobs plan over it again from their next iteration). OutOfRange for an
  // unknown worker; FailedPrecondition when it would leave no usable worker.
  absl::Status DrainWorker(int worker, bool now = false);
  absl::Status EnableWorker(int worker);
  // Device operations recorded so far that ended after `since_s` (bounded ring: the oldest go).
  std::vector<OpRecord> Timeline(double since_s = -1) const;
  std::string ChromeTrace() const;  // the same as chrome://tracing JSON
  void Shutdown();

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Number of CUDA devices this process sees (0 without a GPU or a CUDA build).
int VisibleCudaDevices();
BuildInfo EngineBuildInfo();

}  // namespace rp::scheduler
