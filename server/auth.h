// auth.h — bearer-token access control: every RPC (health checks excepted) must carry
// "authorization: Bearer <token>" matching one configured token. Tokens are compared in
// constant time and never logged.
//
// Contract: immutable after construction; Check() is thread-safe.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>
#include <vector>

namespace rp::server {

class Authenticator {
 public:
  explicit Authenticator(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}
  bool enabled() const { return !tokens_.empty(); }
  // OK when auth is off or the call carries a valid token; UNAUTHENTICATED otherwise.
  grpc::Status Check(const grpc::ServerContextBase& context) const;
  // Constant-time equality (time depends only on the lengths).
  static bool SecureEquals(const std::string& a, const std::string& b);

 private:
  std::vector<std::string> tokens_;
};

}  // namespace rp::server
