// status_util.h — the one place where absl::Status becomes grpc::Status (ARCHITECTURE §6), and the
// exception barrier every RPC handler and background task runs its work behind.
//
// Contract: pure functions, any thread. ToGrpcStatus bounds the message (kMaxStatusMessageBytes)
// so client input echoed into an error can never make oversized trailers. Guarded runs `fn` and
// turns any exception it throws into INTERNAL naming `what` (and logs it): an unexpected
// exception never escapes into gRPC (which would answer UNKNOWN/UNIMPLEMENTED with no message) or
// kills the daemon.
#pragma once

#include <grpcpp/support/status.h>

#include <exception>
#include <string>
#include <type_traits>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rp::server {

inline constexpr size_t kMaxStatusMessageBytes = 1024;

grpc::Status ToGrpcStatus(const absl::Status& status);

// `text` cut to at most `max_bytes` (at a UTF-8 character boundary), saying how much was cut.
std::string BoundedText(absl::string_view text, size_t max_bytes);

// Logs and builds the INTERNAL status for an exception caught in `what`.
absl::Status InternalFromException(absl::string_view what, const char* exception_text);

template <typename Fn>
auto Guarded(absl::string_view what, Fn&& fn) -> decltype(fn()) {
  using R = decltype(fn());
  static_assert(std::is_same_v<R, absl::Status> || std::is_constructible_v<R, absl::Status>,
                "Guarded: fn must return absl::Status or absl::StatusOr");
  try {
    return fn();
  } catch (const std::exception& e) {
    return R(InternalFromException(what, e.what()));
  } catch (...) {
    return R(InternalFromException(what, "unknown exception"));
  }
}

}  // namespace rp::server
