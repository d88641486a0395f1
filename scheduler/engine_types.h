// engine_types.h — the value types of the engine facade (scheduler/engine.h): what a job is,
// what it reports, what a batch and a tensor look like across the wall. Plain structs of
// standard, planning and shared spec types (workers/spec: the model, the optimizer's
// hyperparameters) only: no LibTorch, no data-plane header, no gRPC — the daemon compiles against
// these without the data plane on its include path (checked at build time, tests/cmake/layering).
//
// Contract: value types; copy freely, read from any thread. Functions are pure.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/partition.h"
#include "workers/spec/model_config.h"
#include "workers/spec/optimizer_spec.h"

namespace rp::scheduler {

using JobId = int64_t;

// The precision of a job's master copy (what the devices compute in). The optimizer always
// keeps an fp32 copy and fp32 moments.
enum class Precision { kFloat32, kBFloat16, kFloat16 };
int PrecisionBytes(Precision p);
const char* PrecisionName(Precision p);  // "fp32", "bf16", "fp16"

// A server-side data file cut into batches by the engine's runner (no feeding from outside):
// flat little-endian uint16/uint32 ".bin", a 1-d/2-d ".npy" of uint16/uint32/int32/int64, or a
// JSON Lines file of documents tokenized with the job's tokenizer (kJsonl, below), or a token
// dataset file (kTokenDataset: tokens, loss mask and document boundaries in a safetensors file, as
// `roundpipe_client.py prepare` writes rendered chat; runtime/token_dataset_file.h). Windows of
// sequence_length + 1 tokens with stride sequence_length, global_batch windows per batch, the last
// partial batch of an epoch dropped, `max_epochs` passes. A resumed job continues at the
// checkpoint's data cursor.
struct TokenFileSource {
  // kAuto: by name (".npy", ".jsonl", ".safetensors"), else flat uint16.
  enum class Format { kAuto, kBinUint16, kBinUint32, kNpy, kJsonl, kTokenDataset };
  std::string path;
  Format format = Format::kAuto;
  int64_t global_batch = 0;
  int64_t sequence_length = 0;
  int64_t max_epochs = 1;
  // Windows in a seeded order, a fresh permutation each epoch. The order is a pure function of
  // (shuffle_seed, epoch), so a resumed job continues it exactly from its data cursor.
  bool shuffle = false;
  uint64_t shuffle_seed = 0;
  // kJsonl: one JSON object per line, either {"text": ...} (every token trained) or
  // {"prompt": ..., "completion": ...} (loss on the completion only). Each document is encoded
  // with the tokenizer's own special-token template (Llama-3: <|begin_of_text|> first); a
  // completion is encoded on its own, so prompt and completion meet at a token boundary; then
  // eos_token. Documents are packed back to back into the windows (plain concatenation).
  std::string tokenizer_dir;  // holds tokenizer.json; empty = the job's hf_dir
  // Appended after every document; empty = tokenizer_config.json's eos_token when the tokenizer
  // dir has one, else nothing.
  std::string eos_token;
  // Packing of documents into windows (JSONL and token dataset files, which know their
  // documents): kConcatenate lets attention run across document boundaries (positions run on
  // through the window); kDocumentMasked keeps attention inside each document, restarts the
  // positions at every document start (and at each window's start) and trains no target across
  // a boundary — a packed window computes what its documents would, run one by one.
  enum class Packing { kConcatenate, kDocumentMasked };
  Packing packing = Packing::kConcatenate;
};

// Evaluation on a validation source (JobSpec::validation): a forward-only pass through the
// pipeline over all of it (no optimizer work, no weight gradient), every `every_steps` optimizer
// steps (counted like checkpoints, resumed steps included) and once at the end of a job that
// succeeds. The eval loss is the mean CE over every labelled token of the validation set.
struct EvalPolicy {
  int64_t every_steps = 0;  // 0 = only at the end
  // > 0: the job ends (SUCCEEDED, saying why) once this many evaluations in a row did not
  // improve on the best eval loss.
  int early_stopping_patience = 0;
  // The checkpoint of the best evaluation is kept (never pruned by keep_last): a job with a
  // checkpoint root writes one at every new best.
  bool keep_best_checkpoint = false;
  // Sample generations at every evaluation (the final one included), from the weights evaluated,
  // through the job's own pipeline (runtime/generate.h): each prompt's completion, encoded and
  // decoded with the job's tokenizer (the data's tokenizer_dir or the model's hf_dir; byte-level
  // for a model of 256+ tokens without one). Empty prompts: none.
  struct Samples {
    std::vector<std::string> prompts;
    int max_new_tokens = 32;
    double temperature = 0;  // 0 = greedy
    uint64_t seed = 0;
  } samples;
};

// The limits of sample generations (EvalPolicy::Samples; Engine::Generate's request).
inline constexpr int kMaxSamplePrompts = 16;
inline constexpr size_t kMaxSamplePromptBytes = 16384;
inline constexpr int kMaxSampleNewTokens = 1024;
// InvalidArgument naming `field`'s member ("<field>.prompts[2]: ...") for prompts or options
// beyond those limits; OK for none.
absl::Status CheckSampleOptions(const EvalPolicy::Samples& s, const std::string& field);

// One prompt's sample generation (EvalStats::samples).
struct GeneratedSample {
  std::string prompt;
  std::string completion;          // decoded
  std::vector<int32_t> token_ids;  // what the model generated (the prompt's ids not included)
};

// Data parallelism across nodes (paper §6): this engine is node `rank` of `size`; it trains on
// its share of every global batch (what it is fed, or its token file) and sums gradients with the
// other nodes' engines before every step (workers/data_parallel.h), dividing by the labelled
// tokens of all nodes: the nodes together train what one engine would on the whole batch. Every
// node's job must be the same spec but for this field and its data. Communicators find each
// other through a rendezvous store (EngineOptions::rendezvous_store picks it from this spec; by
// default one store of this process: nodes that are engines of one process).
struct DataParallelSpec {
  int rank = 0;
  int size = 1;
  std::string group;                   // names the job's group (one per job and run)
  std::string hostname = "127.0.0.1";  // this node's address for the collectives
  int64_t timeout_ms = 60000;          // every collective's deadline, and the rendezvous'
  // ZeRO-1 over whole parameters: each node keeps the optimizer state of (and steps) only the
  // parameters it owns, about 1/size of them by elements, and shares the updated weights. Its
  // checkpoints gather the whole state (each node's holds all of it: it resumes on any number of
  // nodes), and are taken only where every node takes one: every checkpoint_every steps, and
  // at a successful end (a requested one, or a cancelled job's last, is FailedPrecondition).
  bool shard_optimizer_state = true;
  // Where the group's rendezvous store is (the daemon's cluster: the coordinator's address;
  // empty: this process). Read by EngineOptions::rendezvous_store, not by the engine.
  std::string coordinator;
  // The job's token file holds every node's data: batch k of this node is rows
  // [rank * B / size, (rank + 1) * B / size) of the file's batch k (B = token_file.global_batch,
  // which size must divide), so the nodes together train the file's global batches. False: the
  // token file (or the fed batches) is this node's share already.
  bool shard_token_file = false;
  // The gradients cross the wire as bf16, summed in fp32 (DataParallelOptions::bf16_gradients).
  bool bf16_gradients = false;
};

struct JobSpec {
  std::string name;
  spec::ModelConfig model;  // dense llama / qwen3 families (the engine refuses others by name)
  Precision precision = Precision::kFloat32;
  uint64_t seed = 0;   // weight initialisation
  std::string hf_dir;  // non-empty: initial weights from this Hugging Face model directory
  // Non-empty: continue from this training checkpoint (weights, optimizer, step, partition,
  // data cursor); max_steps then counts the steps of this run.
  std::string resume_from;
  // LoRA jobs (model.lora.rank > 0): initial adapters from this PEFT directory (default: A
  // random, B zero).
  std::string lora_adapter_dir;
  // Checkpoint policy: every `checkpoint_every` optimizer steps (counted from the start of the
  // job, resumed steps included) the runner writes `<checkpoint_root>/step-<N>` holding exactly
  // N steps — a deterministic point, so an async job's trajectory does not depend on timing —
  // and keeps the newest `checkpoint_keep_last`. Checkpoint() writes there too. A job with a
  // root writes its final state there before it reports SUCCEEDED or CANCELLED and then frees
  // its host state.
  int64_t checkpoint_every = 0;
  std::string checkpoint_root;
  int checkpoint_keep_last = 3;
  std::optional<planning::Partition> partition;  // default: planned from parameter sizes
  bool auto_partition = false;                   // profile one layer per slot, then plan from measured times
  // Per-stage device memory for the automatic partition; 0 = derived from the GPUs, none on
  // the CPU backend.
  int64_t stage_memory_cap = 0;
  // The automatic partition's knobs (planning::PartitionProblem::min_stages, ::t_max_window); 0 = off.
  int partition_min_stages = 0;
  double partition_t_max_window = 0;
  int microbatches = 0;            // 0 = number of devices
  int microbatches_per_round = 0;  // 0 = M; -1 = chosen with the automatic partition
  spec::OptimizerSpec optimizer;
  spec::LrSchedule lr_schedule;
  // kAsync: staleness-1 asynchronous optimizer; consecutive batches overlap (no flush).
  planning::OptimizerMode optimizer_mode = planning::OptimizerMode::kSync;
  int64_t max_steps = 0;                      // 0 = until the input is closed (or the token file ends)
  std::optional<TokenFileSource> token_file;  // set: the runner reads batches; FeedBatch is refused
  // Streamed jobs: batches accepted and not yet taken by the runner, over all feeders of the
  // job together. FeedBatch waits (up to its timeout) while this many wait.
  int max_queued_batches = 4;
  int priority = 0;  // higher runs first; FIFO (submission order) among equals
  // Its weight among the jobs running side by side (EngineOptions::max_running_jobs): each
  // device's compute goes to the running jobs in proportion to their shares. > 0.
  double share = 1;
  // Submitted paused (as if Pause came before the runner could take it): a job its user paused,
  // re-admitted after a daemon restart, never runs until Resume.
  bool start_paused = false;
  // Held-out data, cut into batches like token_file (its global_batch and sequence_length are the
  // training ones when 0; never shuffled; its max_epochs is ignored: one pass per evaluation).
  std::optional<TokenFileSource> validation;
  EvalPolicy eval;
  // Where the runner writes the per-layer costs it measured (planning/profile_file.h), once an
  // automatic partition has been planned from them; empty = nowhere. `roundpipe-sim --profile`
  // replays it.
  std::string profile_path;
  std::optional<DataParallelSpec> data_parallel;  // set: one node of a data-parallel job
};

// Queued -> Running (loading first: kProgress events say how far) <-> Paused -> an end state.
enum class JobState { kQueued, kRunning, kPaused, kSucceeded, kFailed, kCancelled };
bool IsTerminal(JobState s);
const char* JobStateName(JobState s);

struct CheckpointInfo {
  std::string path;
  int64_t step = 0;              // optimizer steps the checkpoint holds
  int64_t batches_consumed = 0;  // the job's data cursor at that point
};

// A change of a job's plan, decided between two iterations (runtime/controller_replan.cc): a
// worker left the job's pool (lost, or drained by an operator) or came back — the next iterations
// are planned over the workers usable then — or a stage slot ran out of device memory, and the
// job re-plans its partition with a tighter per-stage memory cap (the slot itself was repeated).
struct PlanChange {
  enum class Cause { kWorkerLost, kWorkerDrained, kWorkerReturned, kOutOfMemory } cause = Cause::kWorkerLost;
  int worker = -1;               // the daemon's worker (device index) concerned; -1: none
  int workers = 0;               // workers the next iterations are planned over
  std::string partition;         // the partition re-planned from the next iteration on (empty: unchanged)
  int64_t stage_memory_cap = 0;  // kOutOfMemory: the tighter cap it was planned with
  std::string detail;            // in words: why, and what was (or could not be) re-planned
};
const char* PlanChangeCauseName(PlanChange::Cause c);

struct IterationStats {
  int iteration = 0;
  double loss = 0;     // mean CE over the batch's non-ignored tokens
  int64_t tokens = 0;  // non-ignored tokens
  double seconds = 0;  // forward/backward + optimizer, wall clock
  double lr = 0;
  double grad_norm = 0;               // before clipping
  std::vector<double> worker_busy_s;  // compute-stream busy time per worker
  double bubble_ratio = 0;            // 1 - sum(busy) / (N x pipeline span)
  int64_t activation_peak_bytes = 0;
  int64_t host_state_bytes = 0;   // the job's model states after this step (store + optimizer state)
  std::string partition;          // the partition this iteration ran with
  std::string partition_problem;  // non-empty: the automatic partition could not be planned (why)
  double predicted_bubble = 0;    // the planner's estimate for it (automatic partitions only)
  double loss_scale = 1;          // dynamic loss scale used for this iteration's gradients
  bool skipped_step = false;      // fp16: gradients overflowed, the step was skipped
  double optimizer_seconds = 0;   // wall time of this iteration's optimizer step
  // Data parallel (several nodes): this node's time inside collectives since the previous
  // iteration's report, and the fp32 bytes it put into them (sync: this iteration's exchange;
  // async: what the optimizer worker exchanged meanwhile, overlapping compute).
  double collective_seconds = 0;
  int64_t collective_bytes = 0;
  // A lost worker (runtime/slot_recovery.h): the workers this iteration was planned over (fewer
  // than the job's once one is lost) and its stage slots run again because their worker was lost.
  int workers = 0;
  int slots_rerun = 0;
  // What changed in the plan before this iteration was dispatched (it ran with the change).
  std::vector<PlanChange> plan_changes;
};

// One evaluation on the validation source.
struct EvalStats {
  int64_t step = 0;                      // optimizer steps the weights hold
  double loss = 0;                       // mean CE over the validation set's labelled tokens
  int64_t tokens = 0;                    // labelled tokens evaluated
  double seconds = 0;                    // the whole pass
  double best_loss = 0;                  // the best eval loss so far (this one included)
  int64_t best_step = 0;                 // and its step
  bool is_best = false;                  // this evaluation is the best so far
  std::string checkpoint;                // keep_best_checkpoint: the checkpoint kept for this best one
  std::vector<GeneratedSample> samples;  // EvalPolicy::samples, from the weights evaluated
};

// Why a queued job has not started yet (JobEvent::Kind::kWaiting). Jobs start in priority order
// (FIFO among equals): a job waits behind the queued job that goes first, for a free running
// slot, or for host memory for its model states while other jobs run.
struct JobWait {
  enum class Cause { kNone, kBehind, kRunningLimit, kHostMemory } cause = Cause::kNone;
  JobId ahead = 0;  // kBehind: the queued job that starts first
  int ahead_priority = 0;
  std::vector<JobId> running;  // kRunningLimit, kHostMemory: the jobs running now
  int max_running = 0;         // kRunningLimit: EngineOptions::max_running_jobs
  int64_t need_bytes = 0;      // kHostMemory: the job's predicted model states (and CPU workers' stage copies)
  int64_t free_bytes = 0;      // kHostMemory: what the host can give now
  bool operator==(const JobWait&) const = default;
};

struct JobEvent {
  // kCheckpointFailed: a checkpoint (policy or requested) could not be written; `message` says
  // why. After kMaxCheckpointFailures policy failures in a row the job pauses. kProgress: what
  // a loading job is doing ("loading weights 37 %"), in `message`.
  // kEval: an evaluation on the validation source finished (`eval`). kProfile: the measured
  // profile was written to the path in `message`; kProfileFailed: it could not be, `message` says why.
  // kWaiting: a queued job's reason for waiting changed (`wait`). kPlanChange: a worker left or
  // rejoined the job's pool, or a device out-of-memory re-planned it (`plan_change`).
  enum class Kind {
    kState,
    kIteration,
    kBatchRejected,
    kCheckpoint,
    kCheckpointFailed,
    kProgress,
    kEval,
    kProfile,
    kProfileFailed,
    kWaiting,
    kPlanChange
  } kind = Kind::kState;
  JobState state = JobState::kQueued;
  IterationStats stats;                        // kIteration
  std::string message;                         // kState (failure reason), kBatchRejected, kCheckpointFailed, kProgress
  std::chrono::system_clock::time_point time;  // when the engine emitted it
  CheckpointInfo checkpoint;                   // kCheckpoint
  EvalStats eval;                              // kEval
  JobWait wait;                                // kWaiting: why it has not started (cause kNone: it starts now)
  PlanChange plan_change;                      // kPlanChange: emitted before the iteration that runs with it
  // kState to kPaused: who paused the job. kRequested: a caller's Pause (a user or a drain),
  // before or while it ran; `message` only adds detail. kByEngine: the engine paused the job
  // itself (checkpoints kept failing); `message` says why.
  enum class PauseCause { kRequested, kByEngine } pause_cause = PauseCause::kRequested;
};

// Failure policies of the runner (both optimizer modes):
//  - a job whose checkpoint policy failed this many times in a row pauses (fix the disk, resume);
//  - fp16: a job fails when a step overflows with the loss scale at its floor (1), or when this
//    many steps in a row overflowed (it diverged; skipping forever would report success);
//  - any precision: a step whose loss is not finite fails the job, naming the step.
inline constexpr int kMaxCheckpointFailures = 3;
inline constexpr int kMaxConsecutiveSkippedSteps = 32;

// One global batch: rows x cols token ids, row-major. `labels` empty: the next-token shift of
// each row (the last position ignored); otherwise rows x cols targets, kIgnoreLabel = no loss.
struct Batch {
  static constexpr int32_t kIgnoreLabel = -100;
  int64_t rows = 0, cols = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> labels;
};

// The next-token targets of `tokens` with positions where `loss_mask` is false ignored (what a
// client's loss mask means); `loss_mask` empty = every target counts.
std::vector<int32_t> ShiftedLabels(int64_t rows, int64_t cols, const std::vector<int32_t>& tokens,
                                   const std::vector<bool>& loss_mask = {});

// A parameter's fp32 value, row-major.
struct TensorValue {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
};

// What a job is doing now (GetJob-style snapshots; Status reads never wait for training).
struct JobInfo {
  JobState state = JobState::kQueued;
  std::string message;                 // why it failed / paused, or what it is loading
  int64_t steps_done = 0;              // optimizer steps, resumed ones included
  int64_t batches_consumed = 0;        // data cursor
  int queued_batches = 0;              // streamed batches waiting for the runner
  int64_t total_steps = 0;             // max_steps, or what the token file holds; 0 = open-ended
  std::optional<EvalStats> last_eval;  // the latest evaluation (its best_* fields: the best so far)
  // A job resumed from a checkpoint (resume_from): whether that state holds the evaluation of its
  // own step (the checkpoint was taken after it), so that it is not run again. Fixed at Submit.
  bool resumed_after_its_evaluation = false;
  std::string best_checkpoint;  // keep_best_checkpoint: the best evaluation's checkpoint
  std::string profile;          // the measured profile's file, once written
  // Host memory of the model states (master copies, fp32 copies, gradients, optimizer state):
  // as predicted at Submit (what admission used), and the most held after any step of this run
  // (0 before the first); the activation store's peak (checkpoints, boundary activations).
  int64_t predicted_host_state_bytes = 0;
  // CPU backend: the workers' stage copies live in host memory too (planning::CpuWorkingSetBytes);
  // admission counts them beside the states. 0 on GPUs.
  int64_t predicted_worker_bytes = 0;
  int64_t peak_host_state_bytes = 0;
  int64_t peak_activation_bytes = 0;
};

// Per device: bytes copied host<->device per kind, busy seconds per stream, memory.
struct DeviceStats {
  std::string name;         // "cpu:0", "cuda:1"
  std::string description;  // e.g. the GPU model
  // In the pool (kUp), taken out by an operator (kDrained: what was queued finishes, nothing new
  // is planned there), or lost (kLost: failed or drained at once; its slots were re-run
  // elsewhere; `lost_reason` says why). Engine::DrainWorker / EnableWorker.
  enum class State { kUp, kDrained, kLost } state = State::kUp;
  std::string lost_reason;
  int64_t activation_up_bytes = 0, activation_down_bytes = 0, param_up_bytes = 0, grad_down_bytes = 0;
  double compute_busy_s = 0, transfer_busy_s = 0;  // since the engine started
  int64_t memory_total_bytes = 0, memory_in_use_bytes = 0, memory_peak_bytes = 0;
  int64_t pinned_reserved_bytes = 0, pinned_in_use_bytes = 0;
};

struct EngineStats {
  std::vector<DeviceStats> devices;
  int jobs_total = 0;
  int jobs_active = 0;
  // Host memory: the sums over the running jobs.
  int64_t host_model_bytes = 0;       // of the running jobs' host model stores (allocated: anonymous memory)
  int64_t host_mapped_bytes = 0;      // of its masters that alias model files instead (a LoRA base: page cache)
  int64_t host_registered_bytes = 0;  // of those, registered for DMA (CUDA): page cache locked while the job runs
  int64_t host_optimizer_bytes = 0;   // of its optimizer state (moments)
  int64_t host_activation_bytes = 0;  // of its activation store now (checkpoints, boundary activations)
  // The worker pool: how many jobs may run side by side, and each running job's share and the
  // compute time its lanes were given on all workers so far.
  int max_running_jobs = 1;
  struct RunningJob {
    JobId id = 0;
    double share = 1;
    double compute_seconds = 0;
    std::vector<double> worker_compute_seconds;  // per worker (device index): its share of compute_seconds
  };
  std::vector<RunningJob> running;
};

// The engine's host memory by pool, named as GetServerInfo and the metrics name them:
// model_states, optimizer_state, activations, mapped_base, registered_base, pinned. Disjoint:
// mapped_base is the mapped masters the kernel may drop, registered_base the mapped masters
// registered for DMA (locked until the job ends).
struct HostPool {
  const char* name;
  int64_t bytes;
};
std::vector<HostPool> HostPools(const EngineStats& s);

// One recorded device operation (Engine::Timeline): worker, stream ("compute", "act_up", ...),
// label ("F s0 mb3", "B1 mb0", "up params s2"), seconds since the engine started.
struct OpRecord {
  int worker = 0;
  std::string stream;
  std::string label;
  int iteration = -1;
  int slot = -1;
  int microbatch = -1;
  double start_s = 0, end_s = 0;
};

// Export formats: kHfModel, the job's natural format — a Hugging Face model directory
// (safetensors + config.json), or for LoRA jobs a PEFT adapter directory; kPeftAdapter (LoRA
// only); kMergedLora, a LoRA job's base with the adapters merged in, as a HF model directory.
enum class ExportKind { kHfModel, kPeftAdapter, kMergedLora };

// Polled between the units of a long step the caller waits for (an export: before each tensor):
// a non-OK status stops the step with that status, leaving nothing half-written behind.
using StopCheck = std::function<absl::Status()>;

struct BuildInfo {
  std::string torch_version;
  bool torch_cuda_built = false;  // the loaded LibTorch has its CUDA library
  int cuda_device_count = 0;
  std::string cpu_optimizer_path;  // the fused AdamW kernel's SIMD path on this CPU
};

}  // namespace rp::scheduler
