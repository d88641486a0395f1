// A job on several daemons (job_manager.h): the coordinator's Submit of a cluster job, a peer's
// StartNode and NodeStatusOf, and every node's watch over the others (the resume of an ended
// cluster job: job_cluster_resume.cc).
#include <algorithm>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "scheduler/job_files.h"
#include "server/cluster.h"
#include "server/file_digest.h"
#include "server/job_cluster_parts.h"
#include "server/job_manager.h"
#include "server/job_manager_internal.h"
#include "server/recovery_plan.h"
#include "server/status_util.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

namespace job_cluster {

constexpr auto kStartNodeDeadline = std::chrono::seconds(60);  // a peer resolves the spec (reads its files)
constexpr auto kWatchEvery = absl::Seconds(1);

int64_t TimeoutMs(const v1::JobSpec& spec) {
  const int64_t s = spec.cluster().timeout_seconds();
  return (s == 0 ? 60 : s) * 1000;
}

std::string NewGroup(const std::string& node) {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                     static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return absl::StrFormat("cluster/%s/%016x", node, r);
}

v1::NodeStatus StatusOf(const std::string& node, const v1::Job& record) {
  v1::NodeStatus s;
  s.set_node(node);
  s.set_job_id(record.id());
  s.set_state(record.state());
  s.set_step(record.progress().step());
  *s.mutable_progress() = record.progress();
  *s.mutable_host_memory() = record.host_memory();
  s.set_message(record.state() == v1::JOB_STATE_FAILED ? record.error() : record.message());
  return s;
}

v1::ClusterNode NodeEntry(int rank, const std::string& node, const std::string& address, const std::string& job_id) {
  v1::ClusterNode n;
  n.set_rank(rank);
  n.set_node(node);
  n.set_address(address);
  n.set_job_id(job_id);
  n.set_state(v1::JOB_STATE_QUEUED);
  return n;
}

bool Ended(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

// Asks each of `others` that has not ended for its state (`cancel`: cancels it), into its entry.
// Returns what would explain a failure here, most telling first: a node that cannot be reached,
// then one that failed (often only because of the first), then one cancelled; "" for none.
std::string LookAtNodes(Cluster* cluster, std::vector<v1::ClusterNode>& others, bool cancel) {
  std::string unreachable, failed, cancelled;
  for (v1::ClusterNode& n : others) {
    if (Ended(n.state())) continue;
    auto st = cancel ? cluster->CancelNode(n.address(), n.job_id(), kCallDeadline)
                     : cluster->GetNode(n.address(), n.job_id(), kCallDeadline);
    const std::string who =
        absl::StrCat("node ", n.rank(), " ('", n.node(), "' at ", n.address(), ", job ", n.job_id(), ")");
    if (!st.ok()) {
      // A coordinator's job is listed only once its own admission is done: not yet, not lost.
      if (st.status().code() == absl::StatusCode::kNotFound && n.state() == v1::JOB_STATE_QUEUED) continue;
      n.set_message(absl::StrCat("cannot be reached: ", st.status().message()));
      if (unreachable.empty()) unreachable = absl::StrCat(who, " cannot be reached: ", st.status().message());
      continue;
    }
    n.set_state(st->state());
    n.set_step(st->step());
    n.set_message(st->message());
    *n.mutable_progress() = st->progress();
    *n.mutable_host_memory() = st->host_memory();
    if (failed.empty() && st->state() == v1::JOB_STATE_FAILED) failed = absl::StrCat(who, " failed: ", st->message());
    if (cancelled.empty() && st->state() == v1::JOB_STATE_CANCELLED) cancelled = absl::StrCat(who, " was cancelled");
  }
  return !unreachable.empty() ? unreachable : !failed.empty() ? failed : cancelled;
}

// The coordinator's view of every node, as metrics labelled by node name.
void PublishNodes(DaemonMetrics& metrics, const v1::ClusterMembership& m) {
  for (const v1::ClusterNode& n : m.nodes()) {
    const prometheus::Labels labels = {{"node", n.node()}};
    metrics.cluster_node_tokens_per_second.Add(labels).Set(n.progress().tokens_per_second());
    metrics.cluster_node_bubble_ratio.Add(labels).Set(n.progress().last_bubble_ratio());
    metrics.cluster_node_collective_bytes.Add(labels).Set(static_cast<double>(n.progress().collective_bytes()));
  }
}

// The other nodes of `job` as its record lists them, and this node's rank.
std::vector<v1::ClusterNode> OtherNodes(ManagedJob& job, int* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  std::vector<v1::ClusterNode> others;
  *self = job.record.cluster().rank();
  for (const v1::ClusterNode& n : job.record.cluster().nodes()) {
    if (n.rank() != *self) others.push_back(n);
  }
  return others;
}

// The SHA-256 of a resolved cluster job's data file (logged with its rate: a large file takes a
// while, on every node at once).
absl::StatusOr<std::string> DataDigest(ManagedJob& job) {
  if (!job.resolved.engine.token_file) {
    return absl::InvalidArgumentError("cluster.nodes: a cluster job reads a server-side data file (data.token_file)");
  }
  const std::string& path = job.resolved.engine.token_file->path;
  const auto t0 = std::chrono::steady_clock::now();
  auto digest = Sha256OfFile(path);
  if (!digest.ok()) {
    return absl::Status(digest.status().code(), absl::StrCat("data.token_file: ", digest.status().message()));
  }
  std::error_code ec;
  const double mib = static_cast<double>(std::filesystem::file_size(path, ec)) / (1 << 20);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  JobLog()->info("[{}] data file {}: SHA-256 {} ({:.1f} MiB in {:.2f} s)", job.id, path, *digest, mib, s);
  return digest;
}

absl::Status StartNodes(Cluster* cluster, ManagedJob& job, const v1::JobSpec& spec, const v1::ClusterMembership& m,
                        const std::vector<std::string>& addresses, const std::vector<std::string>& resume_ids,
                        int64_t resume_step, std::vector<v1::ClusterNode>* started) {
  // Every node must train on the same bytes: they check the data file's digest against this one.
  auto digest = DataDigest(job);
  if (!digest.ok()) return digest.status();
  v1::StartNodeRequest req;
  req.set_data_sha256(*digest);
  *req.mutable_spec() = spec;
  req.set_size(m.size());
  req.set_group(m.group());
  req.set_coordinator_node(cluster->node_name());
  req.set_coordinator_address(cluster->advertise_address());
  req.set_coordinator_job_id(job.id);
  for (int r = 1; r < m.size(); ++r) {
    req.set_rank(r);
    if (!resume_ids.empty()) {
      req.set_resume_job_id(resume_ids[static_cast<size_t>(r - 1)]);
      req.set_resume_step(resume_step);
    }
    const std::string& address = addresses[static_cast<size_t>(r - 1)];
    auto st = cluster->StartNode(address, req, kStartNodeDeadline);
    if (!st.ok()) {
      for (const v1::ClusterNode& n : *started) (void)cluster->CancelNode(n.address(), n.job_id(), kCallDeadline);
      started->clear();
      return absl::Status(st.status().code(),
                          absl::StrCat("cluster: node ", r, " did not take the job: ", st.status().message()));
    }
    started->push_back(NodeEntry(r, st->node(), address, st->job_id()));
    JobLog()->info("[{}] node {} of {} runs on '{}' ({}) as {}", job.id, r, m.size(), st->node(), address,
                   st->job_id());
  }
  absl::MutexLock lock(&job.mu);
  v1::ClusterMembership* out = job.record.mutable_cluster();
  out->set_coordinator_job_id(job.id);
  out->clear_nodes();
  *out->add_nodes() = NodeEntry(0, cluster->node_name(), cluster->advertise_address(), job.id);
  for (const v1::ClusterNode& n : *started) *out->add_nodes() = n;
  return absl::OkStatus();
}

std::vector<int64_t> CheckpointSteps(const std::string& root) {
  std::vector<int64_t> steps;
  for (const scheduler::CheckpointInfo& c : scheduler::ListJobCheckpoints(root)) steps.push_back(c.step);
  return steps;
}

}  // namespace job_cluster

using job_cluster::CheckpointSteps;
using job_cluster::DataDigest;
using job_cluster::Ended;
using job_cluster::kCallDeadline;
using job_cluster::kWatchEvery;
using job_cluster::LookAtNodes;
using job_cluster::NewGroup;
using job_cluster::NodeEntry;
using job_cluster::OtherNodes;
using job_cluster::PublishNodes;
using job_cluster::StartNodes;
using job_cluster::StatusOf;
using job_cluster::TimeoutMs;

absl::StatusOr<v1::Job> JobManager::SubmitCluster(const v1::JobSpec& spec) {
  Cluster* cluster = options_.cluster;
  const int k = spec.cluster().nodes();
  if (!cluster) {
    return absl::FailedPreconditionError(
        "cluster.nodes: this daemon is not in a cluster (DaemonConfig.cluster names its peers)");
  }
  if (k - 1 > static_cast<int>(cluster->peers().size())) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.nodes: ", k, " nodes need ", k - 1,
                                                   " peers; this daemon's cluster lists ", cluster->peers().size(),
                                                   " (DaemonConfig.cluster.peers)"));
  }
  if (spec.cluster().timeout_seconds() < 0 || spec.cluster().timeout_seconds() > 3600) {
    return absl::InvalidArgumentError("cluster.timeout_seconds: 1 to 3600 (0 = 60)");
  }
  if (!spec.data().has_token_file()) {
    return absl::InvalidArgumentError(
        "cluster.nodes: a cluster job reads a server-side data file (data.token_file, the same on every node); "
        "streamed data is not split across nodes yet");
  }
  ClusterJoin join;
  const std::string group = NewGroup(cluster->node_name());
  join.data_parallel =
      scheduler::DataParallelSpec{0, k, group, cluster->collective_host(), TimeoutMs(spec), true, "", true};
  join.data_parallel.bf16_gradients = spec.cluster().bf16_gradients();
  join.membership.set_rank(0);
  join.membership.set_size(k);
  join.membership.set_group(group);
  join.membership.set_coordinator_node(cluster->node_name());
  join.membership.set_coordinator_address(cluster->advertise_address());
  std::vector<v1::ClusterNode> started;
  auto stop = [&] {
    for (const v1::ClusterNode& n : started) (void)cluster->CancelNode(n.address(), n.job_id(), kCallDeadline);
  };
  std::vector<std::string> addresses(cluster->peers().begin(), cluster->peers().begin() + (k - 1));
  join.before_admit = [&](ManagedJob& job) -> absl::Status {
    return StartNodes(cluster, job, spec, join.membership, addresses, {}, 0, &started);
  };
  join.stop_others = [&](ManagedJob&) { stop(); };
  return SubmitAs(spec, &join);
}

absl::StatusOr<v1::NodeStatus> JobManager::StartNode(const v1::StartNodeRequest& r) {
  Cluster* cluster = options_.cluster;
  if (!cluster) return absl::FailedPreconditionError("this daemon is not in a cluster");
  if (r.size() < 2 || r.size() > 4096 || r.rank() < 1 || r.rank() >= r.size() || r.group().empty() ||
      r.group().size() > 256 || r.coordinator_address().empty() || r.coordinator_job_id().empty()) {
    return absl::InvalidArgumentError(
        "StartNode: a rank in [1, size), a size of 2 to 4096, a group of 1 to 256 bytes, the coordinator's "
        "address and job id");
  }
  ClusterJoin join;
  join.own_output_dir = true;
  join.data_parallel = scheduler::DataParallelSpec{
      r.rank(), r.size(), r.group(), cluster->collective_host(), TimeoutMs(r.spec()), true, r.coordinator_address(),
      true};
  join.data_parallel.bf16_gradients = r.spec().cluster().bf16_gradients();
  join.membership.set_rank(r.rank());
  join.membership.set_size(r.size());
  join.membership.set_group(r.group());
  join.membership.set_coordinator_node(r.coordinator_node());
  join.membership.set_coordinator_address(r.coordinator_address());
  join.membership.set_coordinator_job_id(r.coordinator_job_id());
  *join.membership.add_nodes() = NodeEntry(0, r.coordinator_node(), r.coordinator_address(), r.coordinator_job_id());
  join.before_admit = [&](ManagedJob& job) -> absl::Status {
    auto digest = DataDigest(job);
    if (!digest.ok()) return digest.status();
    if (*digest != r.data_sha256()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data.token_file: '", job.resolved.engine.token_file->path, "' on node '", cluster->node_name(),
          "' differs from the coordinator's (SHA-256 ", digest->substr(0, 16), "... here, ",
          r.data_sha256().substr(0, 16), "... on '", r.coordinator_node(), "'): every node must hold the same file"));
    }
    return absl::OkStatus();
  };
  if (!r.resume_job_id().empty()) {
    // Its own copy of the checkpoint, from its earlier node job of the same cluster job.
    auto earlier = table_.Find(r.resume_job_id());
    bool same_job = false;
    if (earlier) {
      absl::MutexLock lock(&earlier->mu);
      same_job = earlier->record.cluster().coordinator_job_id() == r.coordinator_job_id() &&
                 earlier->record.cluster().coordinator_node() == r.coordinator_node();
    }
    if (!same_job) {
      return absl::FailedPreconditionError(absl::StrCat("resume: no earlier node of job ", r.coordinator_job_id(),
                                                        " here named '", r.resume_job_id(), "'"));
    }
    join.resume_from = (std::filesystem::path(options_.jobs_dir) / r.resume_job_id() / "checkpoints" /
                        absl::StrCat("step-", r.resume_step()))
                           .string();
    join.resume_step = r.resume_step();
  }
  auto job = SubmitAs(r.spec(), &join);
  if (!job.ok()) return job.status();
  JobLog()->info("[{}] node {} of {} of job {} on '{}' ({})", job->id(), r.rank(), r.size(), r.coordinator_job_id(),
                 r.coordinator_node(), r.coordinator_address());
  return StatusOf(cluster->node_name(), *job);
}

absl::StatusOr<v1::NodeStatus> JobManager::NodeStatusOf(const std::string& id, bool cancel) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  {
    absl::MutexLock lock(&job->mu);
    if (job->record.cluster().size() < 2) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, " is not a node of a cluster job"));
    }
  }
  if (cancel) {
    auto c = Cancel(id);
    if (!c.ok() && c.status().code() != absl::StatusCode::kFailedPrecondition) return c.status();  // ended: fine
  }
  auto snap = Snapshot(job);
  if (!snap.ok()) return snap.status();
  v1::NodeStatus out = StatusOf(options_.cluster ? options_.cluster->node_name() : "", *snap);
  // A node job writes under this daemon's jobs dir (StartNode): its checkpoints, for a resume.
  for (int64_t s : CheckpointSteps((std::filesystem::path(options_.jobs_dir) / id / "checkpoints").string())) {
    out.add_checkpoint_steps(s);
  }
  return out;
}

void JobManager::WatchCluster(const std::shared_ptr<ManagedJob>& job) {
  Cluster* cluster = options_.cluster;
  if (!cluster) return;
  // After this node succeeded, the others are watched until they end too (they run the same
  // steps), for at most this long; after a failure or a cancel they are cancelled at once.
  constexpr auto kFollowAfterSuccess = std::chrono::seconds(60);
  std::optional<std::chrono::steady_clock::time_point> succeeded_at;
  for (;;) {
    std::vector<v1::ClusterNode> others;
    int self = 0;
    bool ended = false;  // ended other than by success: the others are cancelled
    std::string group;
    {
      absl::MutexLock lock(&job->mu);
      if (job->stop) return;
      job->cv.WaitWithTimeout(&job->mu, kWatchEvery);
      if (job->stop) return;
      const v1::JobState state = job->record.state();
      if (state == v1::JOB_STATE_SUCCEEDED && !succeeded_at) succeeded_at = std::chrono::steady_clock::now();
      ended = Ended(state) && state != v1::JOB_STATE_SUCCEEDED;
      group = job->record.cluster().group();
      others = OtherNodes(*job, &self);
    }
    const std::string fault = LookAtNodes(cluster, others, ended);
    {
      absl::MutexLock lock(&job->mu);
      v1::ClusterMembership* m = job->record.mutable_cluster();
      for (v1::ClusterNode& n : *m->mutable_nodes()) {
        if (n.rank() == self) {
          n.set_state(job->record.state());
          n.set_step(job->record.progress().step());
          *n.mutable_progress() = job->record.progress();
          *n.mutable_host_memory() = job->record.host_memory();
          continue;
        }
        for (const v1::ClusterNode& seen : others) {
          if (seen.rank() == n.rank()) n = seen;
        }
      }
      if (!ended && !succeeded_at) job->cluster_fault = fault;  // what the latest look saw (a hiccup heals)
      if (self == 0 && metrics_ != nullptr) PublishNodes(*metrics_, *m);
    }
    bool all_ended = true;
    for (const v1::ClusterNode& n : others) all_ended = all_ended && Ended(n.state());
    const bool done = ended || (succeeded_at &&
                                (all_ended || std::chrono::steady_clock::now() - *succeeded_at > kFollowAfterSuccess));
    if (done) {
      if (self == 0) cluster->store().ErasePrefix(group + "/");
      return;
    }
  }
}

std::string JobManager::ExplainNodeFailure(const std::shared_ptr<ManagedJob>& job) {
  if (!options_.cluster) return "";
  std::vector<v1::ClusterNode> others;
  int self = 0;
  {
    absl::MutexLock lock(&job->mu);
    if (!job->cluster_fault.empty()) return job->cluster_fault;
    others = OtherNodes(*job, &self);
  }
  return LookAtNodes(options_.cluster, others, false);
}

}  // namespace rp::server
