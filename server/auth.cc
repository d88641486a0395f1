#include "server/auth.h"

namespace rp::server {

bool Authenticator::SecureEquals(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

grpc::Status Authenticator::Check(const grpc::ServerContextBase& context) const {
  if (tokens_.empty()) return grpc::Status::OK;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this daemon requires a bearer token (metadata 'authorization: Bearer <token>'; the CLI "
                        "reads it from --token_file or ROUNDPIPE_TOKEN)");
  }
  const std::string value(it->second.data(), it->second.size());
  const std::string prefix = "Bearer ";
  bool ok = false;
  if (value.size() > prefix.size() && value.compare(0, prefix.size(), prefix) == 0) {
    const std::string presented = value.substr(prefix.size());
    for (const std::string& t : tokens_) ok |= SecureEquals(presented, t);  // no early exit
  }
  if (!ok) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  return grpc::Status::OK;
}

}  // namespace rp::server
