// job_manager.h — the daemon's jobs: admission (spec -> engine), the SQLite job store, data
// feeding (streamed batches through a bounded queue, or a server-side token file), progress and
// events for watchers, metrics, pause/resume/cancel, export, drain and restart recovery.
// Proto messages stop here: the engine below only sees engine types (ARCHITECTURE §1).
//
// JobManager composes parts that each hold one concept and are unit-tested on their own:
// ManagedJob (one job's record and runtime), JobTable (the jobs by id and seq, ListJobs pages),
// PlanRecovery & co (recovery_plan.h: what a restart does with each stored job), JobEventTracker
// (engine events -> the job's record), JobWatchers (a job's WatchJob streams), JobGauges (jobs
// per state), BackgroundTasks (request work off the gRPC threads), ExportJournal (a killed export
// leaves nothing) and JobStore (SQLite). What remains here is the wiring: the engine calls, the
// event pumps and the order of the steps.
//
// Contract: every public method is thread-safe and returns quickly (never waits for training);
// gRPC handlers call it from callback threads. Per job, a pump thread turns engine events into
// JobEvents/metrics/store updates; streamed batches go straight into the engine's bounded
// per-job queue (Engine::FeedBatchAsync), token files are read by the engine itself.
// Subscribers are called with the job's lock held and must only enqueue.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "roundpipe/v1/cluster.pb.h"
#include "roundpipe/v1/jobs.pb.h"
#include "scheduler/engine.h"
#include "server/background_tasks.h"
#include "server/engine_metrics.h"
#include "server/export_journal.h"
#include "server/job_gauges.h"
#include "server/job_spec.h"
#include "server/job_store.h"
#include "server/job_table.h"
#include "server/job_watchers.h"
#include "server/managed_job.h"
#include "server/metrics.h"

namespace rp::server {

class Cluster;

struct JobManagerOptions {
  JobSpecContext spec;         // default_output_dir is replaced per job by <jobs_dir>/<id>
  std::string jobs_dir;        // <state_dir>/jobs
  Cluster* cluster = nullptr;  // DaemonConfig.cluster (job_cluster.cc); null: this daemon alone
};

class JobManager {
 public:
  // Loads the store: finished jobs are listed as they were; QUEUED jobs are admitted again;
  // RUNNING/PAUSED ones are listed as PAUSED (their training state needs a checkpoint to resume).
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(scheduler::Engine* engine, JobStore* store,
                                                            DaemonMetrics* metrics, JobManagerOptions options);
  ~JobManager();

  // A spec with cluster.nodes = K > 1 makes this daemon the coordinator of a job on K nodes
  // (job_cluster.cc): it starts nodes 1..K-1 on its first peers, then admits node 0 here; a node
  // that refuses fails the submission (naming the node), and the nodes already started are
  // cancelled.
  absl::StatusOr<roundpipe::v1::Job> Submit(const roundpipe::v1::JobSpec& spec);
  // The cluster's side (ClusterService, job_cluster.cc): a coordinator asks this daemon to run
  // one node of its job; or for the state of such a node (`cancel`: cancelled first). Only for a
  // daemon in a cluster; NodeStatusOf only for node jobs.
  absl::StatusOr<roundpipe::v1::NodeStatus> StartNode(const roundpipe::v1::StartNodeRequest& request);
  absl::StatusOr<roundpipe::v1::NodeStatus> NodeStatusOf(const std::string& id, bool cancel);
  absl::StatusOr<roundpipe::v1::Job> Get(const std::string& id);
  absl::StatusOr<roundpipe::v1::ListJobsResponse> List(const roundpipe::v1::ListJobsRequest& request);
  absl::StatusOr<roundpipe::v1::Job> Cancel(const std::string& id);
  absl::StatusOr<roundpipe::v1::Job> Pause(const std::string& id);
  // A PAUSED job continues. A cluster job on its coordinator that FAILED or was CANCELLED
  // resumes on `nodes` nodes (0: as before; at most as before) from the newest checkpoint all of
  // them hold (job_cluster.cc: ResumeCluster); blocks for the peers' answers.
  absl::StatusOr<roundpipe::v1::Job> Resume(const std::string& id, int nodes = 0);

  // Streaming: OpenStream checks the job takes streamed batches; FeedAsync validates the batch
  // at once (the returned Status: InvalidArgument, or ResourceExhausted when the job's queue and
  // its waiting room are full) and otherwise runs `done` once the batch is queued in the engine
  // (or can never be), possibly on the engine's runner thread. EndStream closes the job's input
  // unless keep_open.
  absl::Status OpenStream(const std::string& id);
  absl::Status FeedAsync(const std::string& id, const roundpipe::v1::Batch& batch,
                         std::function<void(absl::Status)> done);
  absl::Status EndStream(const std::string& id, bool keep_open);

  // Sends the job's current state at once, then every event; `last` on the terminal state.
  absl::Status Subscribe(const std::string& id, std::shared_ptr<JobSubscriber> subscriber);
  void Unsubscribe(const std::string& id, JobSubscriber* subscriber);

  // Writes the job's weights as a Hugging Face directory (LoRA jobs: a PEFT adapter directory, or
  // with merge_lora the merged weights); `dir` empty = <output_dir>/export-step<N>. Checked before
  // each tensor: `caller_gone` (optional; the RPC cancelled: CANCELLED) and a drain or shutdown
  // (UNAVAILABLE); either ends the export with nothing written. A long export logs its progress.
  absl::StatusOr<std::string> Export(const std::string& id, const std::string& dir, bool merge_lora = false,
                                     const std::function<bool()>& caller_gone = {});
  absl::StatusOr<roundpipe::v1::CheckpointResponse> Checkpoint(const std::string& id);
  // Completions of `sampling`'s prompts from the final weights of a SUCCEEDED or CANCELLED job
  // (its final checkpoint, loaded by the engine on demand and freed after: Engine::Generate),
  // ahead of queued jobs. Stops like Export: `caller_gone` (CANCELLED), a drain or shutdown
  // (UNAVAILABLE). Blocks until done: call it through RunInBackground.
  absl::StatusOr<roundpipe::v1::GenerateResponse> Generate(const std::string& id,
                                                           const roundpipe::v1::SamplePolicy& sampling,
                                                           const std::function<bool()>& caller_gone = {});

  // Stops admitting jobs and pauses running/queued ones; waits up to `deadline` for the running
  // ones to reach their pause point. Returns how many jobs it paused.
  int Drain(std::chrono::seconds deadline);
  bool draining() const;
  int active_jobs() const;
  // The daemon's id of an engine job ("job-000007"; "engine job N" for one it never admitted).
  std::string NameOf(scheduler::JobId engine_id) const;
  // Runs request work that touches files or waits (submit, export, checkpoint, drain) off the
  // gRPC callback threads, so no client can hold them; Shutdown joins these threads, so none
  // outlives the manager. At most kMaxBackgroundTasks run at once: beyond that
  // ResourceExhausted (the task is not run; the caller answers the RPC with it).
  static constexpr int kMaxBackgroundTasks = 64;
  absl::Status RunInBackground(std::function<void()> task);
  // Stops the pumps (the engine's Shutdown cancels what still runs).
  void Shutdown();

 private:
  JobManager(scheduler::Engine* engine, JobStore* store, DaemonMetrics* metrics, JobManagerOptions options);
  // Restart recovery (job_recovery.cc): the store's records become jobs again, as PlanRecovery
  // decides. A job that never ran is admitted again; a started one resumes from its newest
  // usable checkpoint or is listed PAUSED; one that cannot be either is FAILED with the reason.
  // `pause_again`: it was paused by its user (not by the drain), so it stays paused.
  absl::Status Recover();
  struct RecoveredJob {
    std::shared_ptr<ManagedJob> job;
    bool pause_again = false;
  };
  void ContinueIdsAfterJobDirs(size_t listed);
  static std::pair<roundpipe::v1::JobSpec, std::string> StoredSpec(ManagedJob& job);
  void ReadmitAfterRestart(const RecoveredJob& r);
  void ResumeAfterRestart(const RecoveredJob& r);
  void FailRecovered(ManagedJob& job, const std::string& why);
  // Export and Generate (job_outputs.cc): the engine spec of a job as admitted (`live`: this
  // daemon admitted it; else it is resolved again from its stored spec), and its final
  // checkpoint, which must hold `step` (FailedPrecondition otherwise).
  absl::StatusOr<ResolvedJob> AdmittedSpec(ManagedJob& job, bool live, const roundpipe::v1::JobSpec& spec);
  static absl::StatusOr<std::string> FinalCheckpoint(const std::string& id, const ResolvedJob& resolved, int64_t step);
  absl::Status Admit(const std::shared_ptr<ManagedJob>& job);
  // How a node of a cluster job joins (job_cluster.cc): its engine's data-parallel part, its
  // record's membership, and what runs once the spec is resolved, before this node is admitted
  // (`before_admit`: on the coordinator, starting the other nodes; on another node, checking its
  // data file against the coordinator's; `stop_others` undoes the first when the admission fails).
  struct ClusterJoin {
    scheduler::DataParallelSpec data_parallel;
    roundpipe::v1::ClusterMembership membership;
    bool own_output_dir = false;  // a peer writes under its own jobs dir, whatever the spec says
    std::string resume_from;      // set: the node resumes from this checkpoint, of step resume_step
    int64_t resume_step = 0;
    std::function<absl::Status(ManagedJob& job)> before_admit;
    std::function<void(ManagedJob& job)> stop_others;
  };
  absl::StatusOr<roundpipe::v1::Job> SubmitAs(const roundpipe::v1::JobSpec& spec, ClusterJoin* join);
  absl::StatusOr<roundpipe::v1::Job> SubmitCluster(const roundpipe::v1::JobSpec& spec);
  absl::StatusOr<roundpipe::v1::Job> ResumeCluster(const std::shared_ptr<ManagedJob>& job, int nodes);
  // An ended job's pump and watch threads, joined (they end within moments of the job; a few
  // seconds at most, else Unavailable), so the job can be admitted again.
  absl::Status AwaitEndedThreads(const std::shared_ptr<ManagedJob>& job);
  // A cluster job's watch (its own thread until the job ends): every second the other nodes'
  // states into the record's membership; a node that failed or cannot be reached is named in this
  // job's failure; when this job ends, the others still running are cancelled.
  void WatchCluster(const std::shared_ptr<ManagedJob>& job);
  // A cluster job that failed here: what the other nodes say about it (one look, a few seconds
  // at most), for its error; "" when they say nothing (or it is no cluster job).
  std::string ExplainNodeFailure(const std::shared_ptr<ManagedJob>& job);
  // A started job from the store: admit it from its newest usable checkpoint (false: none).
  bool ResumeFromCheckpoint(const std::shared_ptr<ManagedJob>& job, bool paused);
  // A job that has not ended and runs in this daemon's engine (NotFound / FailedPrecondition
  // saying why `action` is impossible otherwise).
  absl::StatusOr<std::pair<std::shared_ptr<ManagedJob>, scheduler::JobId>> LiveJob(const std::string& id,
                                                                                   const char* action);
  void ReapJobThreads();  // joins the pumps of jobs whose loops have returned
  void PumpLoop(const std::shared_ptr<ManagedJob>& job);
  void Publish(ManagedJob& job, roundpipe::v1::JobEvent event, bool last);  // job.mu held
  void Persist(ManagedJob& job);                                            // job.mu held
  absl::StatusOr<roundpipe::v1::Job> Snapshot(const std::shared_ptr<ManagedJob>& job);

  scheduler::Engine* engine_;
  JobStore* store_;
  DaemonMetrics* metrics_;
  JobManagerOptions options_;

  JobTable table_;
  mutable absl::Mutex mu_;  // the admission gate
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;

  mutable absl::Mutex names_mu_;  // a leaf: taken under a job's mu (its pump names other jobs)
  std::map<scheduler::JobId, std::string> names_ ABSL_GUARDED_BY(names_mu_);  // engine id -> job id

  absl::Mutex reap_mu_;  // serialises joining job threads (ReapJobThreads, Shutdown)

  BackgroundTasks tasks_{kMaxBackgroundTasks};
  ExportJournal export_journal_;  // exports in progress; Recover removes what a crash left of them
  JobGauges gauges_;
  EngineMetrics engine_metrics_;  // the engine's counters as increments
};

}  // namespace rp::server
