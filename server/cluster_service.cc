// The ClusterService (cluster_service.h).
#include "server/cluster_service.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/admin_service.h"
#include "server/status_util.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* ctx, const grpc::Status& st) {
  auto* r = ctx->DefaultReactor();
  r->Finish(st);
  return r;
}

template <typename T>
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const absl::StatusOr<T>& result, T* out) {
  if (result.ok()) *out = *result;
  return Finish(ctx, ToGrpcStatus(result.status()));
}

}  // namespace

grpc::ServerUnaryReactor* ClusterServiceImpl::StartNode(grpc::CallbackServerContext* ctx,
                                                        const v1::StartNodeRequest* req, v1::NodeStatus* resp) {
  if (grpc::Status st = cluster_->Authorized(*ctx); !st.ok()) return Finish(ctx, st);
  // Resolving the spec reads the files it names: off the callback thread.
  auto* r = ctx->DefaultReactor();
  absl::Status queued = manager_->RunInBackground([this, r, req, resp] {
    auto out = Guarded("StartNode", [&] { return manager_->StartNode(*req); });
    if (out.ok()) *resp = std::move(*out);
    r->Finish(ToGrpcStatus(out.status()));
  });
  if (!queued.ok()) r->Finish(ToGrpcStatus(queued));
  return r;
}

grpc::ServerUnaryReactor* ClusterServiceImpl::GetNode(grpc::CallbackServerContext* ctx, const v1::NodeRequest* req,
                                                      v1::NodeStatus* resp) {
  if (grpc::Status st = cluster_->Authorized(*ctx); !st.ok()) return Finish(ctx, st);
  return Reply(ctx, Guarded("GetNode", [&] { return manager_->NodeStatusOf(req->job_id(), false); }), resp);
}

grpc::ServerUnaryReactor* ClusterServiceImpl::CancelNode(grpc::CallbackServerContext* ctx, const v1::NodeRequest* req,
                                                         v1::NodeStatus* resp) {
  if (grpc::Status st = cluster_->Authorized(*ctx); !st.ok()) return Finish(ctx, st);
  return Reply(ctx, Guarded("CancelNode", [&] { return manager_->NodeStatusOf(req->job_id(), true); }), resp);
}

grpc::ServerUnaryReactor* ClusterServiceImpl::StoreSet(grpc::CallbackServerContext* ctx, const v1::StoreSetRequest* req,
                                                       v1::StoreSetResponse*) {
  if (grpc::Status st = cluster_->Authorized(*ctx); !st.ok()) return Finish(ctx, st);
  if (req->key().empty() || req->key().size() > kMaxKeyBytes || req->value().size() > kMaxValueBytes) {
    return Finish(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "StoreSet: a key of 1 to 1024 bytes and a value of at most 64 KiB"));
  }
  return Finish(ctx, ToGrpcStatus(cluster_->store().Set(req->key(), req->value())));
}

grpc::ServerUnaryReactor* ClusterServiceImpl::StoreGet(grpc::CallbackServerContext* ctx, const v1::StoreGetRequest* req,
                                                       v1::StoreGetResponse* resp) {
  if (grpc::Status st = cluster_->Authorized(*ctx); !st.ok()) return Finish(ctx, st);
  if (req->key().empty() || req->key().size() > kMaxKeyBytes) {
    return Finish(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "StoreGet: a key of 1 to 1024 bytes"));
  }
  // A key already there is answered at once; waiting for one happens off the callback thread.
  auto now = cluster_->store().Get(req->key(), std::chrono::steady_clock::now());
  if (now.ok() || req->wait_ms() <= 0) {
    resp->set_found(now.ok());
    if (now.ok()) resp->set_value(*now);
    return Finish(ctx, grpc::Status::OK);
  }
  auto* r = ctx->DefaultReactor();
  const auto wait = std::chrono::milliseconds(std::min<int64_t>(req->wait_ms(), 10000));
  absl::Status queued = manager_->RunInBackground([this, r, req, resp, wait] {
    auto got = cluster_->store().Get(req->key(), std::chrono::steady_clock::now() + wait);
    resp->set_found(got.ok());
    if (got.ok()) resp->set_value(*got);
    r->Finish(grpc::Status::OK);
  });
  if (!queued.ok()) r->Finish(ToGrpcStatus(queued));
  return r;
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Describe(grpc::CallbackServerContext* ctx, const v1::DescribeRequest*,
                                                       v1::ClusterMember* resp) {
  if (grpc::Status st = cluster_->Authorized(*ctx); !st.ok()) return Finish(ctx, st);
  *resp = DescribeThisNode(*engine_, *manager_, cluster_->node_name(), cluster_->advertise_address());
  return Finish(ctx, grpc::Status::OK);
}

}  // namespace rp::server
