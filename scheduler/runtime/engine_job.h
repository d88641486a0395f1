// engine_job.h — (runtime) one job of the engine: its spec and the model it runs, its batch
// queue and waiting feeds, its events and state, and while it runs its host model store and
// controller. The engine's table, the builder (job_builder.h) and the runner (job_runner.h)
// share it.
//
// Contract: `mu` guards the queue, the events, the flags and the counters; `run_mu` is held
// while an iteration, a checkpoint or a read of the store runs. Lock order: run_mu, then mu
// (declared: clang's -Wthread-safety checks both, deploy/thread-safety.sh). `store` and
// `controller` are written under both locks and read under either, which the analysis cannot
// express: they carry the rule in words.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"
#include "scheduler/runtime/base_source.h"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/tensor_batch.h"
#include "scheduler/runtime/token_dataset.h"
#include "workers/base/mutex.h"
#include "workers/io/frozen_base.h"
#include "workers/io/safetensors_reader.h"
#include "workers/spec/model_config.h"
#include "workers/spec/rendezvous_store.h"
#include "workers/store/host_model_store.h"
#include "workers/text/tokenizer.h"

namespace rp::scheduler::runtime {

struct WaitingFeed {  // FeedBatchAsync: a batch waiting for room in the queue
  TensorBatch batch;
  std::function<void(absl::Status)> done;
};

// One job of the engine: its spec, its queue and events (mu), and while it runs its host state
// (run_mu). Shared by the engine's table, the builder and the runner.
struct EngineJob {
  JobId id = 0;
  JobSpec spec;
  spec::ModelConfig model;            // spec.model as the engine runs it
  at::ScalarType dtype = at::kFloat;  // spec.precision
  // The job's host state. Both are released (reset under run_mu and mu) once a daemon job has
  // ended and its final state is on disk; readers hold run_mu or copy the pointers under mu.
  // The job's lanes on the engine's devices (lane_device.h), made when a runner takes the job and
  // freed with its controller. Declared before the controller: destroyed after it. Runner only.
  std::vector<std::unique_ptr<workers::Device>> lanes;
  std::shared_ptr<workers::HostModelStore> store;  // null until the runner builds the job
  std::shared_ptr<Controller> controller;
  ControllerOptions controller_options;  // decided at Submit, used by BuildJob
  base::Mutex run_mu;                    // held while an iteration runs (Parameter reads wait for it)
  // After the release: where the final weights are, and what export needs to know of them.
  std::string final_checkpoint ABSL_GUARDED_BY(run_mu);
  std::vector<ParameterShape> final_shapes ABSL_GUARDED_BY(run_mu);
  std::unique_ptr<workers::io::SafetensorsFile> final_weights ABSL_GUARDED_BY(run_mu);  // opened on first Parameter()
  // What the job does not train (a LoRA base): described once (at the first checkpoint, or when
  // a resume checks it); after the release its tensors are read from their source, checked
  // against the final checkpoint's record.
  std::optional<workers::io::FrozenBase> frozen_base ABSL_GUARDED_BY(run_mu);
  std::unique_ptr<BaseSource> final_base ABSL_GUARDED_BY(run_mu);  // opened on the first base read

  std::string comm_binary;  // EngineOptions::comm_binary (data-parallel jobs); set at Submit
  // Where a data-parallel job's nodes meet (EngineOptions::rendezvous_store); null: this
  // process's store. Set at Submit.
  std::shared_ptr<spec::RendezvousStore> rendezvous_store;
  // A generation (Engine::Generate), never listed: the runner generates spec.eval.samples from
  // the loaded weights and ends the job. Set before the job is queued, read-only after.
  bool generation_only = false;
  base::Mutex mu ABSL_ACQUIRED_AFTER(run_mu);
  base::CondVar cv;
  std::deque<TensorBatch> batches ABSL_GUARDED_BY(mu);
  std::deque<WaitingFeed> waiting ABSL_GUARDED_BY(mu);  // at most spec.max_queued_batches
  std::unique_ptr<runtime::TokenDataset> data;          // token-file jobs (opened at Submit: mapped, not read)
  std::unique_ptr<runtime::TokenDataset> validation;    // the validation source (JobSpec::validation)
  // EvalPolicy::samples' tokenizer: its directory (SampleTokenizerDir, decided at Submit; empty:
  // byte-level), and the tokenizer loaded when the job starts (null: byte-level or no samples).
  std::string sample_tokenizer_dir;
  std::shared_ptr<const workers::text::Tokenizer> sample_tokenizer;
  int64_t data_steps ABSL_GUARDED_BY(mu) = 0;  // the data's steps, kept when it is released at the end
  // Evaluations (the runner's): the latest, the best loss and step, how many in a row did not
  // improve on it, the best one's checkpoint (keep_best_checkpoint).
  std::optional<EvalStats> last_eval ABSL_GUARDED_BY(mu);
  bool resumed_after_its_evaluation = false;  // JobInfo's; set at Submit, read-only after
  int evals_without_improvement ABSL_GUARDED_BY(mu) = 0;
  std::string best_checkpoint ABSL_GUARDED_BY(mu);
  std::string profile_written ABSL_GUARDED_BY(mu);  // spec.profile_path once the measured profile is there
  bool input_closed ABSL_GUARDED_BY(mu) = false;
  bool cancel ABSL_GUARDED_BY(mu) = false;
  // Raised with cancel, pause and shutdown: a job still starting (tokenizing its dataset) stops
  // at once instead of at its first iteration boundary (BuildJob returns Cancelled).
  std::atomic<bool> stop_starting{false};
  bool pause ABSL_GUARDED_BY(mu) = false;               // requested; honoured between iterations
  bool controller_started ABSL_GUARDED_BY(mu) = false;  // the runner took the job
  JobState state ABSL_GUARDED_BY(mu) = JobState::kQueued;
  std::string message ABSL_GUARDED_BY(mu);  // of the latest state change or progress report
  std::vector<JobEvent> events ABSL_GUARDED_BY(mu);
  // Generation jobs: what the runner generated, or why it could not (unset: it never ran).
  std::optional<absl::StatusOr<std::vector<GeneratedSample>>> generated ABSL_GUARDED_BY(mu);
  bool finished ABSL_GUARDED_BY(mu) = false;  // the runner is done with it: its host state is freed
  // Checkpoints: requests the runner serves at an iteration boundary; progress counters.
  struct CheckpointRequest {
    std::string note;
    std::shared_ptr<std::promise<absl::StatusOr<CheckpointInfo>>> done;
  };
  std::deque<CheckpointRequest> checkpoints ABSL_GUARDED_BY(mu);
  int64_t first_step = 0;                      // steps taken before this run (resumed jobs)
  int64_t steps_done ABSL_GUARDED_BY(mu) = 0;  // steps reported in this run
  // Host memory: the model states' bytes as predicted at Submit (PredictHostStateBytes), and the
  // most they held after any step of this run (store + optimizer state), and the activation
  // store's peak.
  int64_t predicted_host_state_bytes = 0;  // set by PrepareJob, then read-only
  // CPU backend: the workers' stage copies, in host memory too (planning::CpuWorkingSetBytes);
  // 0 on other backends. Set by PrepareJob. Admission counts both.
  int64_t predicted_worker_bytes = 0;
  int64_t AdmissionBytes() const { return predicted_host_state_bytes + predicted_worker_bytes; }
  int64_t peak_host_state_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t peak_activation_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t consumed_offset = 0;                      // batches consumed before this run
  int64_t consumed ABSL_GUARDED_BY(mu) = 0;         // batches taken from the queue in this run
  int checkpoint_failures ABSL_GUARDED_BY(mu) = 0;  // policy checkpoints failed in a row
  std::string pause_reason ABSL_GUARDED_BY(mu);     // why the runner paused the job itself
  JobWait wait ABSL_GUARDED_BY(mu);                 // why it has not started (the latest kWaiting)
  // Its lanes at the devices' gates (device index, lane), while `lanes` holds them: Stats reads
  // the compute they were given under `mu`, and the lanes go only after this is cleared.
  std::vector<std::pair<int, int>> gate_lanes ABSL_GUARDED_BY(mu);

  bool terminal() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return IsTerminal(state); }
  absl::StatusOr<at::Tensor> ReadParameter(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu);
  void Emit(JobEvent e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    e.time = std::chrono::system_clock::now();
    events.push_back(std::move(e));
    cv.SignalAll();
  }
  void SetState(JobState s, std::string why = "", JobEvent::PauseCause cause = JobEvent::PauseCause::kRequested)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    state = s;
    message = why;
    JobEvent e{JobEvent::Kind::kState, s, {}, std::move(why)};
    e.pause_cause = cause;
    Emit(std::move(e));
  }
  // Writes the state at the current step as <checkpoint_root>/step-<N> and reports it (caller
  // holds run_mu, at an iteration boundary with the optimizer flushed). One that existed already
  // holds this very state: it is returned, and reported again only if `report_existing`.
  // `on_every_node`: every node of a data-parallel job takes this checkpoint at this step (its
  // policy's, or its successful end); a node whose optimizer state is sharded gathers the whole
  // state for it from the others, and takes no other checkpoint (FailedPrecondition).
  absl::StatusOr<CheckpointInfo> CheckpointNow(const std::string& note, bool report_existing = true,
                                               bool on_every_node = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu)
      ABSL_LOCKS_EXCLUDED(mu);
  // A checkpoint result as an event (caller holds mu): written, or failed and why.
  void ReportCheckpoint(const absl::StatusOr<CheckpointInfo>& info, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

}  // namespace rp::scheduler::runtime
