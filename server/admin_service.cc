#include "server/admin_service.h"

#include <google/protobuf/stubs/common.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/version.h>
#include <unistd.h>

#include <thread>

#include "server/engine_metrics.h"
#include "server/status_util.h"

#ifndef RP_VERSION
#define RP_VERSION "dev"
#endif

namespace rp::server {

namespace v1 = roundpipe::v1;

v1::BuildInfo CollectBuildInfo() {
  v1::BuildInfo info;
  info.set_roundpipe_version(RP_VERSION);
  const scheduler::BuildInfo engine = scheduler::EngineBuildInfo();
  info.set_torch_version(engine.torch_version);
  info.set_torch_cuda_built(engine.torch_cuda_built);
  info.set_cuda_device_count(engine.cuda_device_count);
  info.set_grpc_version(grpc::Version());
  info.set_protobuf_version(GOOGLE_PROTOBUF_VERSION);
  info.set_spdlog_version(SPDLOG_VERSION);
  return info;
}

namespace {
const char* StateName(scheduler::DeviceStats::State s) {
  switch (s) {
    case scheduler::DeviceStats::State::kUp:
      return "up";
    case scheduler::DeviceStats::State::kDrained:
      return "drained";
    case scheduler::DeviceStats::State::kLost:
      return "lost";
  }
  return "?";
}

void FillDevice(const scheduler::DeviceStats& ds, int index, v1::DeviceInfo* d) {
  d->set_name(ds.name);
  d->set_description(ds.description);
  d->set_memory_bytes(ds.memory_total_bytes);
  d->set_memory_used_bytes(ds.memory_in_use_bytes);
  d->set_state(StateName(ds.state));
  d->set_lost_reason(ds.lost_reason);
  d->set_worker(index);
}
}  // namespace

grpc::ServerUnaryReactor* AdminServiceImpl::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                          const v1::GetServerInfoRequest*, v1::ServerInfo* resp) {
  auto* r = ctx->DefaultReactor();
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) {
    r->Finish(st);
    return r;
  }
  const scheduler::EngineStats s = engine_->Stats();
  for (size_t i = 0; i < s.devices.size(); ++i) FillDevice(s.devices[i], static_cast<int>(i), resp->add_devices());
  resp->set_host_memory_bytes(static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  resp->set_pinned_memory_bytes(s.devices.empty() ? 0 : s.devices.front().pinned_reserved_bytes);
  *resp->mutable_build() = CollectBuildInfo();
  resp->set_cpu_adamw_path(scheduler::EngineBuildInfo().cpu_optimizer_path);
  resp->set_jobs_active(manager_->active_jobs());
  resp->set_draining(manager_->draining());
  for (const scheduler::HostPool& p : scheduler::HostPools(s)) {
    v1::HostPool* pool = resp->add_host_pools();
    pool->set_name(p.name);
    pool->set_bytes(p.bytes);
  }
  resp->set_max_running_jobs(s.max_running_jobs);
  for (const scheduler::EngineStats::RunningJob& j : s.running) {
    v1::PoolJob* pj = resp->add_running_jobs();
    pj->set_job_id(manager_->NameOf(j.id));
    pj->set_share(j.share);
    pj->set_compute_seconds(j.compute_seconds);
    for (double s : j.worker_compute_seconds) pj->add_worker_compute_seconds(s);
  }
  if (!cluster_) {
    r->Finish(grpc::Status::OK);
    return r;
  }
  // The peers are asked off the callback thread (each within 2 s).
  absl::Status queued = manager_->RunInBackground([this, r, resp] {
    v1::ClusterInfo* c = resp->mutable_cluster();
    c->set_node(cluster_->node_name());
    c->set_address(cluster_->advertise_address());
    *c->add_members() = DescribeThisNode(*engine_, *manager_, cluster_->node_name(), cluster_->advertise_address());
    for (const std::string& peer : cluster_->peers()) {
      auto m = cluster_->Describe(peer, std::chrono::seconds(2));
      v1::ClusterMember* out = c->add_members();
      if (m.ok()) {
        *out = *m;
      } else {
        out->set_error(std::string(m.status().message()));
      }
      out->set_address(peer);
      out->set_reachable(m.ok());
    }
    r->Finish(grpc::Status::OK);
  });
  if (!queued.ok()) r->Finish(ToGrpcStatus(queued));
  return r;
}

v1::ClusterMember DescribeThisNode(const scheduler::Engine& engine, const JobManager& manager, const std::string& node,
                                   const std::string& address) {
  v1::ClusterMember m;
  m.set_node(node);
  m.set_address(address);
  m.set_reachable(true);
  const scheduler::EngineStats s = engine.Stats();
  for (size_t i = 0; i < s.devices.size(); ++i) FillDevice(s.devices[i], static_cast<int>(i), m.add_devices());
  m.set_host_memory_bytes(static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  m.set_jobs_active(manager.active_jobs());
  return m;
}

grpc::ServerUnaryReactor* AdminServiceImpl::Drain(grpc::CallbackServerContext* ctx, const v1::DrainRequest* req,
                                                  v1::DrainResponse* resp) {
  auto* r = ctx->DefaultReactor();
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) {
    r->Finish(st);
    return r;
  }
  if (req->deadline_seconds() < 0) {
    r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "deadline_seconds must not be negative"));
    return r;
  }
  const int64_t secs = req->deadline_seconds() > 0 ? req->deadline_seconds() : default_drain_seconds_;
  // Waiting for running jobs to reach their pause point happens off the callback thread.
  absl::Status queued = manager_->RunInBackground([this, r, resp, secs] {
    resp->set_jobs_paused(manager_->Drain(std::chrono::seconds(secs)));
    r->Finish(grpc::Status::OK);
  });
  if (!queued.ok()) r->Finish(ToGrpcStatus(queued));
  return r;
}

grpc::ServerUnaryReactor* AdminServiceImpl::DrainWorker(grpc::CallbackServerContext* ctx, const v1::WorkerRequest* req,
                                                        v1::DeviceInfo* resp) {
  return ChangeWorker(ctx, req, resp, /*enable=*/false);
}

grpc::ServerUnaryReactor* AdminServiceImpl::EnableWorker(grpc::CallbackServerContext* ctx, const v1::WorkerRequest* req,
                                                         v1::DeviceInfo* resp) {
  return ChangeWorker(ctx, req, resp, /*enable=*/true);
}

grpc::ServerUnaryReactor* AdminServiceImpl::ChangeWorker(grpc::CallbackServerContext* ctx, const v1::WorkerRequest* req,
                                                         v1::DeviceInfo* resp, bool enable) {
  auto* r = ctx->DefaultReactor();
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) {
    r->Finish(st);
    return r;
  }
  if (enable && req->now()) {
    r->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "now applies to DrainWorker only"));
    return r;
  }
  const absl::Status done =
      enable ? engine_->EnableWorker(req->worker()) : engine_->DrainWorker(req->worker(), req->now());
  if (!done.ok()) {
    r->Finish(ToGrpcStatus(done));
    return r;
  }
  const scheduler::EngineStats s = engine_->Stats();
  FillDevice(s.devices[static_cast<size_t>(req->worker())], req->worker(), resp);
  if (metrics_ != nullptr) SetWorkerStates(metrics_, s);
  r->Finish(grpc::Status::OK);
  return r;
}

}  // namespace rp::server
