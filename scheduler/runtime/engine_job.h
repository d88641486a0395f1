// engine_job.h — (runtime) one job of the engine: its spec and the model it runs, its batch
// queue and waiting feeds, its events and state, and while it runs its host model store and
// controller. The engine's table, the builder (job_builder.h) and the runner (job_runner.h)
// share it.
//
// Contract: `mu` guards the queue, the events, the flags and the counters; `run_mu` is held
// while an iteration, a checkpoint or a read of the store runs. Lock order: run_mu, then mu.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/token_dataset.h"
#include "workers/io/safetensors_reader.h"
#include "workers/models/transformer_config.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler::runtime {

// A batch as the controller takes it.
struct TensorBatch {
  at::Tensor tokens;
  std::optional<at::Tensor> labels;
};
struct WaitingFeed {  // FeedBatchAsync: a batch waiting for room in the queue
  TensorBatch batch;
  std::function<void(absl::Status)> done;
};

// One job of the engine: its spec, its queue and events (mu), and while it runs its host state
// (run_mu). Shared by the engine's table, the builder and the runner.
struct EngineJob {
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
  void ReportCheckpoint(const absl::StatusOr<CheckpointInfo>& info, int64_t step);
};

}  // namespace rp::scheduler::runtime
