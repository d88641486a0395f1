// job_cluster_parts.h — what the job manager's cluster files share (job_cluster.cc: submit,
// start, watch; job_cluster_resume.cc: resume): starting a job's other nodes, its rendezvous
// group, its node entries, the checkpoints a node holds. Not for other rooms.
//
// Contract: free functions; StartNodes calls the peers (seconds), the others are pure or read
// the local checkpoint directory.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "roundpipe/v1/cluster.pb.h"
#include "roundpipe/v1/jobs.pb.h"
#include "server/cluster.h"
#include "server/managed_job.h"

namespace rp::server::job_cluster {

// A call on another member that should answer at once (state, cancel).
inline constexpr auto kCallDeadline = std::chrono::seconds(3);

// The spec's collective timeout in milliseconds (cluster.timeout_seconds, default 60).
int64_t TimeoutMs(const roundpipe::v1::JobSpec& spec);
// A rendezvous group no other job (of this or an earlier run of the daemon) ever had.
std::string NewGroup(const std::string& node);
roundpipe::v1::ClusterNode NodeEntry(int rank, const std::string& node, const std::string& address,
                                     const std::string& job_id);
// Starts nodes 1..K-1 of `job` (m: K and the group) on `addresses` (node r on addresses[r-1]),
// each told the data file's digest and, with `resume_ids`, to resume from its earlier node job's
// checkpoint at `resume_step`; the started ones go into *started and the record's membership
// (this node first). A refusal cancels those already started.
absl::Status StartNodes(Cluster* cluster, ManagedJob& job, const roundpipe::v1::JobSpec& spec,
                        const roundpipe::v1::ClusterMembership& m, const std::vector<std::string>& addresses,
                        const std::vector<std::string>& resume_ids, int64_t resume_step,
                        std::vector<roundpipe::v1::ClusterNode>* started);
// The steps of the complete checkpoints under `root`.
std::vector<int64_t> CheckpointSteps(const std::string& root);

}  // namespace rp::server::job_cluster
