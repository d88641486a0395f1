// controller.h — (runtime: behind the engine facade) one per job: turns the DispatchPlan into stage tasks for the
// device workers, splits each global batch into micro-batches, wires the per-micro-batch dependencies through the
// ActivationStore's events, runs the synchronous optimizer step, and reports per-iteration stats (paper §4.1).
//
// Sync mode: the optimizer step runs after every stage of the iteration finished; the next
// iteration starts afterwards (exact; the reference semantics).
// Async mode (staleness 1, paper §3.2): SubmitIteration returns as soon as the iteration's
// stages are enqueued, so iteration T+1 can be submitted before T is awaited and the dispatch
// flows across the boundary without a flush (g0 continues); an OptimizerWorker steps T while
// T+1 runs on the weights stepped with T-1's gradients, ordered by the layerwise consistency
// protocol (workers/consistency.h). At most two iterations are in flight.
//
// Contract: Submit/Await/Flush are called from one thread at a time. The controller does not
// own the devices, the store or the timeline; they must outlive it. A failed iteration (bad
// input, a kernel error) returns a Status, discards its gradients and leaves the controller
// usable. In async mode read the store only after Flush().
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/planning/partition.h"
#include "scheduler/runtime/slot_recovery.h"
#include "workers/consistency.h"
#include "workers/data_parallel.h"
#include "workers/device/device.h"
#include "workers/device/timeline.h"
#include "workers/device_worker.h"
#include "workers/optim/adamw.h"
#include "workers/optim/loss_scaler.h"
#include "workers/optimizer_worker.h"
#include "workers/spec/model_config.h"
#include "workers/store/activation_store.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler {

struct ControllerOptions {
  // The tag of this job's operations in the timeline (its devices are lanes tagged so,
  // lane_device.h): its statistics and profile read only those. -1: untagged devices.
  int timeline_job = -1;
  planning::Partition partition;
  int microbatches = 1;            // M per iteration
  int microbatches_per_round = 0;  // M_R (0 = M)
  workers::AdamWOptions adamw;
  spec::LrSchedule lr_schedule;
  workers::LossScalerOptions loss_scaler;  // enable for fp16 master copies
  int64_t head_chunk_tokens = 4096;
  planning::OptimizerMode mode = planning::OptimizerMode::kSync;
  // Automatic partitioning (paper §4.4): the first iterations run one layer per stage slot and
  // measure every layer's forward / recompute+backward / fused time; after `profile_iterations`
  // measured iterations (the first is dropped as warm-up) AutoPartition on the smoothed
  // estimates picks the partition used from the next iteration boundary on. `partition` is
  // ignored then. In async mode the switch drains the pipeline once.
  bool auto_partition = false;
  int profile_iterations = 3;
  // Device memory one stage may use, for the automatic partition (0 = none): weights, device
  // gradients and the activations autograd keeps (estimated from the model's shape and the
  // profiled batches' micro-batch size and sequence length, planning::AnalyticCostModel).
  int64_t stage_memory_cap = 0;
  // The authors' knobs for that partition (planning::PartitionProblem::min_stages and
  // ::t_max_window): at least this many stage slots; t_max within this factor of the least
  // possible. 0 = off.
  int min_stages = 0;
  double t_max_window = 0;
  // Choose among the exact search's candidates (the best few of every stage count) by
  // simulating them on the measured times (planning::SimulatedBestPartition, this mode and round
  // size, recompute-ahead as set below); false = the paper's objective alone.
  bool partition_by_simulation = true;
  // With that choice and microbatches_per_round 0: the round size is chosen with the partition
  // (planning::SimulatedChoice::choose_round_size: each M_R dividing M and at least N); the
  // iterations after profiling run with it.
  bool choose_round_size = false;
  // Backward stages recompute each micro-batch as soon as its checkpoint is on the device and
  // only the backward proper waits for the upstream gradient (the timeline shows "R B2 mb3"
  // then "B2 mb3"); false: the stage waits for every input first (the paper's rule, ablation).
  bool recompute_ahead = true;
  // Resuming from a checkpoint: optimizer steps already taken (the LR schedule continues from
  // there) and the optimizer / loss-scaler state to start with.
  int64_t first_step = 0;
  std::optional<workers::AdamWState> resume_adamw;
  double resume_loss_scale = 0;  // 0 = the scaler's initial scale
  int64_t resume_good_steps = 0;
  // Set: this controller is one node of a data-parallel job (workers/data_parallel.h): it
  // divides by the labelled tokens of every node and sums the gradients with the others before
  // each step.
  std::shared_ptr<workers::DataParallelGroup> data_parallel;
};

// What a checkpoint needs from a controller (taken at a flush point).
struct OptimizerSnapshot {
  workers::AdamWState adamw;
  double loss_scale = 1;
  int64_t good_steps = 0;
};

// One evaluation pass (Controller::Evaluate): the summed CE over the batch's labelled tokens.
struct EvalResult {
  double loss_sum = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

class Controller {
 public:
  ~Controller();
  static absl::StatusOr<std::unique_ptr<Controller>> Create(ControllerOptions options, workers::HostModelStore* store,
                                                            std::vector<workers::Device*> devices,
                                                            workers::Timeline* timeline);

  // tokens: [B, S] int64 (int32 accepted); labels: same shape, -100 = ignored (default: the
  // next-token shift of `tokens`). B must be divisible by the micro-batch count. positions
  // (packed documents): same shape, 0 where a document starts, else the previous + 1; attention
  // stays inside each document (models::DocumentLayout). Absent: 0..S-1 in every row.
  absl::StatusOr<IterationStats> RunIteration(const at::Tensor& tokens,
                                              const std::optional<at::Tensor>& labels = std::nullopt,
                                              const std::optional<at::Tensor>& positions = std::nullopt);
  // Enqueues one iteration and returns its number. Async: returns at once (FailedPrecondition
  // when two iterations are already in flight); sync: runs it, including the step.
  // `validated`: the caller checked the batch whole already (runtime::ValidateBatch); it is not
  // scanned again.
  absl::StatusOr<int> SubmitIteration(const at::Tensor& tokens, const std::optional<at::Tensor>& labels = std::nullopt,
                                      const std::optional<at::Tensor>& positions = std::nullopt,
                                      bool validated = false);
  // An evaluation pass over one batch (same rules as RunIteration) through the pipeline on the
  // current weights: the forward stage slots of the plan, then B_1's slot as a loss-only stage
  // (no autograd); no backward slot, no gradient, no optimizer step, nothing of the training
  // state changes. Only between iterations: FailedPrecondition while one is in flight; in async
  // mode it first lets the optimizer finish (a Flush), so the weights are every step so far.
  absl::StatusOr<EvalResult> Evaluate(const at::Tensor& tokens, const std::optional<at::Tensor>& labels = std::nullopt,
                                      const std::optional<at::Tensor>& positions = std::nullopt);
  // Generation: a pass like Evaluate's over `tokens` [B, S] (B divisible by the micro-batches;
  // positions as in RunIteration — a row's left padding may be a document of its own) that
  // computes no loss but each row's logits at its last position: [B, vocab] fp32 on the host,
  // the next token's scores. Same rules as Evaluate (between iterations; async: after a Flush).
  absl::StatusOr<at::Tensor> LastLogits(const at::Tensor& tokens,
                                        const std::optional<at::Tensor>& positions = std::nullopt);
  // Waits for a submitted iteration (async: its stages and its optimizer step) and returns its
  // stats or its error.
  absl::StatusOr<IterationStats> AwaitIteration(int iteration);
  // Async: no further iteration follows for now — lets the optimizer finish every pending step
  // (P_cp included) and waits for it; afterwards the store holds the fully updated weights and
  // the next iteration starts from them (a drain point). Sync: nothing to do.
  absl::Status Flush();

  // The checks RunIteration applies to a batch (shape, dtype, divisibility, id ranges), for
  // callers that accept batches before they run (Engine::FeedBatch).
  absl::Status ValidateBatch(const at::Tensor& tokens, const std::optional<at::Tensor>& labels,
                             const std::optional<at::Tensor>& positions = std::nullopt) const;
  // What Create checks of the options (partition, round structure, chunking) for a model, without
  // a store: the engine refuses a bad job at Submit, before anything is allocated.
  static absl::Status ValidateOptions(const ControllerOptions& options, const spec::ModelConfig& cfg, int num_workers);
  // The same rules for a model of `vocab` tokens trained in `microbatches` micro-batches (no
  // controller needed: the engine checks batches of jobs that have not been built yet).
  static absl::Status ValidateBatchFor(int64_t vocab, int microbatches, const at::Tensor& tokens,
                                       const std::optional<at::Tensor>& labels,
                                       const std::optional<at::Tensor>& positions = std::nullopt);

  int next_g0() const { return next_g0_; }
  const planning::Partition& partition() const { return opt_.partition; }
  // This node's data-parallel group (null: the job runs on one node).
  workers::DataParallelGroup* data_parallel() const { return opt_.data_parallel.get(); }
  int microbatches() const { return opt_.microbatches; }  // M of every pass
  // The round size in use (0 = M); with choose_round_size, the planned one after profiling.
  int microbatches_per_round() const { return opt_.microbatches_per_round; }
  // Automatic partitioning: the smoothed measured per-layer costs, once complete.
  std::optional<planning::CostModel> measured_costs() const { return measured_; }
  // One micro-batch's stage-boundary activation device -> host -> device, measured in the
  // profiling iterations: twice the median download of a forward slot's output (the upload of
  // an input may include waiting for its producer, so it is not timed). < 0: not measured.
  double measured_activation_hop_s() const { return measured_hop_s_; }
  // The micro-batch shape and worker count they were measured with.
  int64_t measured_microbatch_rows() const { return last_microbatch_rows_; }
  int64_t measured_sequence_length() const { return last_seq_len_; }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  // A lost worker (device_health.h): its unfinished stage slots are re-run on the others and the
  // next iterations are planned over the workers still usable (runtime/slot_recovery.h).
  int usable_workers() const { return static_cast<int>(recovery_->Usable().size()); }
  int workers_lost() const { return recovery_->workers_lost(); }
  int64_t slots_rerun() const { return recovery_->slots_rerun(); }
  int iterations_done() const { return iteration_; }
  // The optimizer's state; only between iterations after Flush (async) or any iteration (sync).
  OptimizerSnapshot Snapshot() const;
  const workers::ActivationStore& activations() const { return acts_; }
  // Bytes of the optimizer's state (moments) as allocated so far; any thread.
  int64_t OptimizerStateBytes() const;

 private:
  Controller(ControllerOptions options, workers::HostModelStore* store, std::vector<workers::Device*> devices,
             workers::Timeline* timeline);

  ControllerOptions opt_;
  workers::HostModelStore* store_;
  std::vector<workers::Device*> devices_;
  std::vector<std::unique_ptr<workers::DeviceWorker>> workers_;
  std::unique_ptr<runtime::SlotRecovery> recovery_;  // every stage slot goes through it
  workers::Timeline* timeline_;
  workers::ActivationStore acts_;
  workers::AdamW adamw_;
  workers::LossScaler scaler_;
  struct InFlight {
    std::shared_ptr<workers::RunContext> ctx;
    std::vector<workers::EventPtr> done;
    std::chrono::steady_clock::time_point start;
    double timeline_start = 0;
    double lr = 0, loss_scale = 1;
    std::optional<absl::StatusOr<IterationStats>> result;  // sync mode: already complete
    std::optional<workers::StepResult> drained_step;       // async: collected by a drain
    std::vector<planning::StageSlot> slots;                // the iteration's dispatch plan
    int workers = 0;                                       // the plan's worker count
    int slots_rerun = 0;                                   // re-run after a lost worker
    planning::Partition partition;
    std::vector<PlanChange> plan_changes;  // decided before it was dispatched
  };
  void ApplyPartition(const planning::Partition& p);
  // Before an iteration is dispatched (controller_replan.cc): notes the workers that left or
  // rejoined the pool; after a device out-of-memory tightens the stage memory cap; re-plans the
  // partition (for the workers usable now, under the cap) when either asks for it, which
  // ApplyPlannedPartition then applies. What changed goes to pending_changes_.
  void Replan();
  void NoteWorkerChanges(const std::vector<int>& usable);
  // Plans the partition for `num_workers` under opt_.stage_memory_cap on `costs` (the measured
  // ones, or real memory with every layer's time alike); true when planned_ was replaced.
  bool PlanPartition(const planning::CostModel& costs, int num_workers, bool simulate, std::string* why);
  // SubmitIteration's steps: the automatic plan's partition applied (async: after a drain); the
  // iteration's run context; its dispatch plan submitted to the workers; sync mode's wait and
  // optimizer step (f.result).
  void ApplyPlannedPartition();
  std::shared_ptr<workers::RunContext> MakeRunContext(int T, int64_t seq_len, int64_t valid,
                                                      std::vector<at::Tensor> positions);
  absl::Status DispatchIteration(int T, InFlight& f);
  void FinishSyncIteration(int T, InFlight& f);
  // The batch's micro-batches in the devices' host memory: per micro-batch its tokens, labels
  // and (when given) positions; `valid` = the labelled tokens of the whole batch.
  struct HostBatch {
    std::vector<at::Tensor> tokens, labels, positions;
    int64_t valid = 0;
  };
  // `training`: a batch without a labelled token is refused (it would divide by zero);
  // `validated`: ValidateBatch is skipped (the caller checked it whole).
  absl::StatusOr<HostBatch> ToHostMicrobatches(const at::Tensor& tokens, const std::optional<at::Tensor>& labels,
                                               const std::optional<at::Tensor>& positions, bool training,
                                               bool validated = false);
  // Evaluate's and LastLogits' pass: the plan's forward slots, B_1's as a loss (or logits) stage.
  absl::StatusOr<std::shared_ptr<workers::RunContext>> ForwardPass(HostBatch host, int64_t seq_len, bool last_logits);
  int evaluations_ = 0;  // evaluation passes run (their iteration ids: -2, -3, ...)
  void RecordProfile(int iteration, const InFlight& f);
  std::unique_ptr<planning::MeasuredProfile> profile_;
  int profiled_iterations_ = 0;
  int64_t last_microbatch_rows_ = 0, last_seq_len_ = 0;  // shape of the latest batch's micro-batches
  std::string plan_problem_;                             // why the latest automatic planning failed
  std::optional<planning::PartitionResult> planned_;
  std::optional<planning::CostModel> measured_;
  std::vector<double> hop_samples_;  // forward slots' output downloads in the profiling iterations
  double measured_hop_s_ = -1;
  std::map<int, InFlight> inflight_;
  std::unique_ptr<workers::ConsistencyBook> book_;       // async only
  std::unique_ptr<workers::OptimizerWorker> optimizer_;  // async only
  IterationStats FinishStats(int iteration, InFlight& f);
  // The data-parallel group's collectives since the previous report, into `st` (the caller's
  // thread: Submit/Await's).
  void CountTraffic(IterationStats& st);
  workers::DataParallelGroup::Traffic traffic_seen_;
  std::vector<int> act_consumers_;
  std::vector<int> last_usable_;             // the workers usable at the latest Replan
  int plan_workers_ = 0;                     // the workers planned_ was planned for
  bool cap_from_memory_fault_ = false;       // opt_.stage_memory_cap was tightened by Replan
  std::vector<PlanChange> pending_changes_;  // for the next iteration's stats
  int next_g0_ = 0;
  int iteration_ = 0;
};

}  // namespace rp::scheduler
