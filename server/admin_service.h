// admin_service.h — roundpipe.v1.AdminService: server info (devices and their state in the
// pool, memory, versions, build options), Drain, and one worker out of the pool or back in.
//
// Contract: the service and what it points to outlive the grpc::Server.
#pragma once

#include "roundpipe/v1/admin.grpc.pb.h"
#include "scheduler/engine.h"
#include "server/auth.h"
#include "server/cluster.h"
#include "server/job_manager.h"
#include "server/metrics.h"

namespace rp::server {

// Versions and build options of this binary.
roundpipe::v1::BuildInfo CollectBuildInfo();
// This daemon as a cluster member: its devices, host memory and active jobs (ClusterService.Describe).
roundpipe::v1::ClusterMember DescribeThisNode(const scheduler::Engine& engine, const JobManager& manager,
                                              const std::string& node, const std::string& address);

class AdminServiceImpl final : public roundpipe::v1::AdminService::CallbackService {
 public:
  // `metrics` (optional): roundpipe_worker_state follows DrainWorker / EnableWorker at once.
  // `cluster` (optional): GetServerInfo lists every member (asking the peers, off the callback thread).
  AdminServiceImpl(scheduler::Engine* engine, JobManager* manager, const Authenticator* auth,
                   int64_t default_drain_seconds, DaemonMetrics* metrics = nullptr, Cluster* cluster = nullptr)
      : engine_(engine),
        manager_(manager),
        auth_(auth),
        default_drain_seconds_(default_drain_seconds),
        metrics_(metrics),
        cluster_(cluster) {}

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const roundpipe::v1::GetServerInfoRequest* req,
                                          roundpipe::v1::ServerInfo* resp) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* ctx, const roundpipe::v1::DrainRequest* req,
                                  roundpipe::v1::DrainResponse* resp) override;
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* ctx, const roundpipe::v1::WorkerRequest* req,
                                        roundpipe::v1::DeviceInfo* resp) override;
  grpc::ServerUnaryReactor* EnableWorker(grpc::CallbackServerContext* ctx, const roundpipe::v1::WorkerRequest* req,
                                         roundpipe::v1::DeviceInfo* resp) override;

 private:
  grpc::ServerUnaryReactor* ChangeWorker(grpc::CallbackServerContext* ctx, const roundpipe::v1::WorkerRequest* req,
                                         roundpipe::v1::DeviceInfo* resp, bool enable);

  scheduler::Engine* engine_;
  JobManager* manager_;
  const Authenticator* auth_;
  int64_t default_drain_seconds_;
  DaemonMetrics* metrics_;
  Cluster* cluster_;
};

}  // namespace rp::server
