// cluster_service.h — roundpipe.v1.ClusterService (proto/roundpipe/v1/cluster.proto) on the gRPC
// callback API: what the other daemons of this daemon's cluster may ask of it. Every call must
// carry the cluster's token (Cluster::Authorized); clients' tokens open nothing here. Starting a
// node and waiting for a rendezvous key run off the callback threads (JobManager's background
// tasks).
//
// Contract: the service and the JobManager / Cluster it points to outlive the grpc::Server.
#pragma once

#include "roundpipe/v1/cluster.grpc.pb.h"
#include "server/cluster.h"
#include "server/job_manager.h"

namespace rp::server {

class ClusterServiceImpl final : public roundpipe::v1::ClusterService::CallbackService {
 public:
  // A key of at most 1 KiB, a value of at most 64 KiB.
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxValueBytes = 64 * 1024;

  ClusterServiceImpl(JobManager* manager, Cluster* cluster, const scheduler::Engine* engine)
      : manager_(manager), cluster_(cluster), engine_(engine) {}
  grpc::ServerUnaryReactor* StartNode(grpc::CallbackServerContext* ctx, const roundpipe::v1::StartNodeRequest* req,
                                      roundpipe::v1::NodeStatus* resp) override;
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* ctx, const roundpipe::v1::NodeRequest* req,
                                    roundpipe::v1::NodeStatus* resp) override;
  grpc::ServerUnaryReactor* CancelNode(grpc::CallbackServerContext* ctx, const roundpipe::v1::NodeRequest* req,
                                       roundpipe::v1::NodeStatus* resp) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* ctx, const roundpipe::v1::StoreSetRequest* req,
                                     roundpipe::v1::StoreSetResponse* resp) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* ctx, const roundpipe::v1::StoreGetRequest* req,
                                     roundpipe::v1::StoreGetResponse* resp) override;
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* ctx, const roundpipe::v1::DescribeRequest* req,
                                     roundpipe::v1::ClusterMember* resp) override;

 private:
  JobManager* manager_;
  Cluster* cluster_;
  const scheduler::Engine* engine_;
};

}  // namespace rp::server
