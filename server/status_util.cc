#include "server/status_util.h"

#include <spdlog/spdlog.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace rp::server {

std::string BoundedText(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  const absl::string_view suffix_probe = " ... (999999999999 bytes cut)";
  size_t keep = max_bytes > suffix_probe.size() ? max_bytes - suffix_probe.size() : 0;
  // Never split a UTF-8 sequence: back up over continuation bytes (10xxxxxx).
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  return absl::StrCat(text.substr(0, keep), " ... (", text.size() - keep, " bytes cut)");
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering (0..16).
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())),
                      BoundedText(status.message(), kMaxStatusMessageBytes));
}

absl::Status InternalFromException(absl::string_view what, const char* exception_text) {
  const std::string text = BoundedText(exception_text ? exception_text : "", 512);
  spdlog::error("{}: unexpected exception: {}", std::string(what), text);
  return absl::InternalError(absl::StrCat(what, ": internal error (", text, "); the daemon logged it"));
}

}  // namespace rp::server
