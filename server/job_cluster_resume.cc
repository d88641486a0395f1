// The resume of a cluster job that failed or was cancelled (job_manager.h: Resume; DAEMON.md "A
// cluster of daemons"): the newest checkpoint every node of the resumed job holds, its other
// nodes started again from their own copies, this node admitted again from its own.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "scheduler/job_files.h"
#include "server/cluster.h"
#include "server/job_cluster_parts.h"
#include "server/job_manager.h"
#include "server/job_manager_internal.h"
#include "server/recovery_plan.h"

namespace rp::server {

namespace v1 = roundpipe::v1;
using job_cluster::CheckpointSteps;
using job_cluster::kCallDeadline;
using job_cluster::NewGroup;
using job_cluster::NodeEntry;
using job_cluster::StartNodes;
using job_cluster::TimeoutMs;

namespace {

// The newest checkpoint step that this node (under `root`) and nodes 1..k-1 of `before` all
// hold; the nodes' addresses and earlier job ids go into *addresses and *earlier_ids. A node that
// cannot be reached (waited for up to kCallDeadline) is UNAVAILABLE, naming it.
absl::StatusOr<int64_t> AgreedCheckpointStep(Cluster* cluster, const std::string& id,
                                             const v1::ClusterMembership& before, int k, const std::string& root,
                                             std::vector<std::string>* addresses,
                                             std::vector<std::string>* earlier_ids) {
  std::vector<int64_t> common = CheckpointSteps(root);
  for (int r = 1; r < k; ++r) {
    const v1::ClusterNode* n = nullptr;
    for (const v1::ClusterNode& x : before.nodes()) {
      if (x.rank() == r) n = &x;
    }
    if (!n) return absl::InternalError(absl::StrCat("job ", id, " does not list its node ", r));
    auto st = cluster->GetNode(n->address(), n->job_id(), kCallDeadline, /*wait_for_ready=*/true);
    if (!st.ok()) {
      return absl::UnavailableError(absl::StrCat("node ", r, " ('", n->node(), "' at ", n->address(),
                                                 ") cannot be reached: ", st.status().message(),
                                                 "; resume when it is back, or on ", r, " node(s) (nodes: ", r, ")"));
    }
    std::vector<int64_t> both;
    for (int64_t s : common) {
      if (std::find(st->checkpoint_steps().begin(), st->checkpoint_steps().end(), s) != st->checkpoint_steps().end()) {
        both.push_back(s);
      }
    }
    common = std::move(both);
    addresses->push_back(n->address());
    earlier_ids->push_back(n->job_id());
  }
  if (common.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, ": no checkpoint that all ", k, " node(s) hold; resubmit it"));
  }
  return *std::max_element(common.begin(), common.end());
}

// The record of a job resumed from `dir` (step `step`) with membership `m` (job.mu held).
void RecordResumed(Cluster* cluster, const v1::ClusterMembership& m, const std::string& dir, int64_t step,
                   ManagedJob* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu) {
  const int k = m.size();
  job->record.set_state(v1::JOB_STATE_QUEUED);
  job->record.clear_error();
  job->record.set_message(absl::StrCat("resumed from ", dir, " on ", k, " node(s)"));
  job->record.mutable_progress()->set_step(step);
  job->record.set_last_checkpoint(dir);
  job->record.set_last_checkpoint_step(step);
  v1::ClusterMembership* out = job->record.mutable_cluster();
  const auto listed = out->nodes();
  *out = m;
  out->set_coordinator_job_id(job->id);
  if (k > 1) {
    *out->mutable_nodes() = listed;
  } else {
    *out->add_nodes() = NodeEntry(0, cluster->node_name(), cluster->advertise_address(), job->id);
  }
  job->cluster_fault.clear();
}

}  // namespace

absl::Status JobManager::AwaitEndedThreads(const std::shared_ptr<ManagedJob>& job) {
  // Its pump and watch end within moments of its end (the watch's last look at the others).
  for (int i = 0; i < 200 && job->threads_running.load() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ReapJobThreads();
  if (job->threads_running.load() != 0) {
    return absl::UnavailableError(absl::StrCat("job ", job->id, " is still ending; resume it in a moment"));
  }
  {
    absl::MutexLock reap(&reap_mu_);  // both threads have left their loops: joined at once
    if (job->pump.joinable()) job->pump.join();
    if (job->cluster_watch.joinable()) job->cluster_watch.join();
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::ResumeCluster(const std::shared_ptr<ManagedJob>& job, int nodes) {
  Cluster* cluster = options_.cluster;
  if (!cluster) return absl::FailedPreconditionError("this daemon is no longer in a cluster");
  {
    absl::MutexLock lock(&mu_);
    if (draining_ || shutdown_)
      return absl::UnavailableError("the daemon is draining; resume the job after it restarts");
  }
  bool idle = false;
  if (!job->resuming.compare_exchange_strong(idle, true)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job->id, " is being resumed already"));
  }
  absl::Cleanup done = [&job] { job->resuming = false; };
  v1::JobSpec spec;
  v1::ClusterMembership before;
  std::string owner;
  {
    absl::MutexLock lock(&job->mu);
    if (job->record.state() != v1::JOB_STATE_FAILED && job->record.state() != v1::JOB_STATE_CANCELLED) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job->id, " was resumed already"));
    }
    spec = job->record.spec();
    before = job->record.cluster();
    owner = OwnerToken(job->record);
  }
  const int k = nodes == 0 ? before.size() : nodes;
  if (k < 1 || k > before.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nodes: 1 to ", before.size(),
        " (each node resumes from its own copy of the checkpoint: only the nodes that ran the job hold one)"));
  }
  if (absl::Status st = AwaitEndedThreads(job); !st.ok()) return st;
  JobSpecContext ctx = options_.spec;
  ctx.default_output_dir = (std::filesystem::path(options_.jobs_dir) / job->id).string();
  ctx.nodes = k;
  auto resolved = ResolveJobSpec(spec, ctx);
  if (!resolved.ok()) return resolved.status();
  if (absl::Status c = scheduler::ClaimOutputDir(resolved->output_dir, owner); !c.ok()) return c;
  // The newest step every node of the resumed job holds a checkpoint of.
  std::vector<std::string> addresses, earlier_ids;
  auto agreed =
      AgreedCheckpointStep(cluster, job->id, before, k, resolved->engine.checkpoint_root, &addresses, &earlier_ids);
  if (!agreed.ok()) return agreed.status();
  const int64_t step = *agreed;
  const std::string dir = absl::StrCat(resolved->engine.checkpoint_root, "/step-", step);
  const CheckpointResume at = ResumeAt(step, resolved->engine.max_steps);
  if (at.already_finished) return absl::FailedPreconditionError("the job had run all its steps at that checkpoint");
  const std::string group = NewGroup(cluster->node_name());
  v1::ClusterMembership m;
  m.set_rank(0);
  m.set_size(k);
  m.set_group(group);
  m.set_coordinator_node(cluster->node_name());
  m.set_coordinator_address(cluster->advertise_address());
  std::vector<v1::ClusterNode> started;
  job->resolved = *resolved;
  if (k > 1) {
    if (absl::Status st = StartNodes(cluster, *job, spec, m, addresses, earlier_ids, step, &started); !st.ok()) {
      return st;
    }
  }
  scheduler::JobSpec& e = job->resolved.engine;
  if (k > 1) {
    e.data_parallel =
        scheduler::DataParallelSpec{0, k, group, cluster->collective_host(), TimeoutMs(spec), true, "", true};
    e.data_parallel->bf16_gradients = spec.cluster().bf16_gradients();
  }
  e.resume_from = dir;
  e.max_steps = at.steps_left;
  {
    absl::MutexLock lock(&job->mu);
    gauges_.Move(job->record.state(), v1::JOB_STATE_QUEUED);
    RecordResumed(cluster, m, dir, step, job.get());
  }
  if (absl::Status st = Admit(job); !st.ok()) {
    for (const v1::ClusterNode& n : started) (void)cluster->CancelNode(n.address(), n.job_id(), kCallDeadline);
    absl::MutexLock lock(&job->mu);
    gauges_.Move(job->record.state(), v1::JOB_STATE_FAILED);
    job->record.set_state(v1::JOB_STATE_FAILED);
    job->record.set_error(absl::StrCat("could not resume: ", st.message()));
    Persist(*job);
    return st;
  }
  JobLog()->info("[{}] resumed from {} (step {}) on {} node(s)", job->id, dir, step, k);
  {
    absl::MutexLock lock(&job->mu);
    Persist(*job);
  }
  return Snapshot(job);
}

}  // namespace rp::server
