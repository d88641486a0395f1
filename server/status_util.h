// status_util.h — the one place where absl::Status becomes grpc::Status (DESIGN §6).
//
// Contract: pure functions, any thread.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace rp::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace rp::server
