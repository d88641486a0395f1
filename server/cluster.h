// cluster.h — this daemon as a member of a cluster of daemons (DaemonConfig.cluster): its name and
// addresses, the cluster's shared token, a channel to each member it talks to, the rendezvous
// store it serves to the nodes of the jobs it coordinates, and the calls of the internal
// ClusterService (proto/roundpipe/v1/cluster.proto) it makes on the others.
//
// Who calls what: the job manager, as a coordinator, starts, watches and cancels a job's other
// nodes (StartNode / GetNode / CancelNode); the engine, through EngineOptions::rendezvous_store =
// StoreFor, finds a data-parallel job's store (this daemon's own on the coordinator, a client of
// the coordinator's on every other node); ClusterServiceImpl answers the others' calls and checks
// their token (Authorized).
//
// Contract: created once at startup; every method is thread-safe. Calls carry the cluster token
// and a deadline, and return the peer's status (UNAVAILABLE / DEADLINE_EXCEEDED when it cannot be
// reached) with the peer's address in the message.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/server_context.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "roundpipe/v1/cluster.pb.h"
#include "roundpipe/v1/config.pb.h"
#include "scheduler/engine_types.h"
#include "workers/spec/rendezvous_store.h"

namespace rp::server {

class Cluster {
 public:
  // `config` is checked (CheckClusterConfig): reads the token file and the CA file.
  static absl::StatusOr<std::unique_ptr<Cluster>> Create(const roundpipe::v1::ClusterConfig& config);

  // The bound address the peers reach this daemon at (ClusterConfig.advertise_address, or this
  // daemon's first TCP listen address once bound): call once, before serving.
  void SetAdvertiseAddress(const std::string& address);
  const std::string& node_name() const { return node_name_; }
  const std::string& advertise_address() const { return advertise_; }
  // Where this node's collectives listen (ClusterConfig.collective_host, else advertise's host).
  std::string collective_host() const;
  const std::vector<std::string>& peers() const { return peers_; }

  // The store of the data-parallel jobs this daemon coordinates (served to the peers).
  spec::InMemoryStore& store() { return store_; }
  // EngineOptions::rendezvous_store: this daemon's store for a job it coordinates (empty
  // coordinator), else a client of the coordinator's.
  std::shared_ptr<spec::RendezvousStore> StoreFor(const scheduler::DataParallelSpec& dp);

  // The internal calls, on the daemon at `address`.
  absl::StatusOr<roundpipe::v1::NodeStatus> StartNode(const std::string& address,
                                                      const roundpipe::v1::StartNodeRequest& request,
                                                      std::chrono::milliseconds deadline);
  // `wait_for_ready`: a member that is not connected yet is waited for until the deadline (a
  // deliberate step: a resume), instead of failing at once (a watch).
  absl::StatusOr<roundpipe::v1::NodeStatus> GetNode(const std::string& address, const std::string& job_id,
                                                    std::chrono::milliseconds deadline, bool wait_for_ready = false);
  absl::StatusOr<roundpipe::v1::NodeStatus> CancelNode(const std::string& address, const std::string& job_id,
                                                       std::chrono::milliseconds deadline);
  absl::Status StoreSet(const std::string& address, const std::string& key, const std::string& value,
                        std::chrono::milliseconds deadline);
  // found=false when the key did not appear within wait (at most 10 s).
  absl::StatusOr<roundpipe::v1::StoreGetResponse> StoreGet(const std::string& address, const std::string& key,
                                                           std::chrono::milliseconds wait);

  absl::StatusOr<roundpipe::v1::ClusterMember> Describe(const std::string& address, std::chrono::milliseconds deadline);

  // OK when the call carries the cluster's token; UNAUTHENTICATED otherwise.
  grpc::Status Authorized(const grpc::ServerContextBase& context) const;

 private:
  Cluster() = default;
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);

  std::string node_name_, advertise_, collective_host_, token_, peer_ca_;
  std::vector<std::string> peers_;
  spec::InMemoryStore store_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

// DaemonConfig.cluster's defaults (node_name: the host name) and rules, added to `problems`.
void ApplyClusterDefaults(roundpipe::v1::DaemonConfig* config);
void CheckClusterConfig(const roundpipe::v1::DaemonConfig& config, std::vector<std::string>* problems);

}  // namespace rp::server
