// rpc_metrics.h — a gRPC server interceptor that counts every RPC by method and status code and
// times it (roundpipe_rpc_requests_total{method,code}, roundpipe_rpc_duration_seconds{method}).
// Method names are the service's fixed set, so the labels stay low-cardinality.
//
// Contract: the factory and the DaemonMetrics it points to outlive the grpc::Server; the
// interceptors are created and destroyed by gRPC per call.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "server/metrics.h"

namespace rp::server {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptorFactory(
    DaemonMetrics* metrics);

}  // namespace rp::server
