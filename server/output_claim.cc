#include "server/output_claim.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "workers/io/confined_fs.h"

namespace rp::server {

namespace io = workers::io;

std::string OwnerToken(const roundpipe::v1::Job& record) {
  return absl::StrCat(record.id(), " ", record.created().seconds(), ".", record.created().nanos());
}

absl::Status ClaimOutputDir(const std::string& dir, const std::string& owner) {
  if (absl::Status st = io::MakeDirs(dir); !st.ok()) return st;
  const std::string path = absl::StrCat(dir, "/", kOutputClaimFile);
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::Status st = io::WriteNewFile(path, owner + "\n");
    if (st.ok()) return st;
    if (!absl::IsAlreadyExists(st)) return st;
    auto text = io::ReadSmallFile(path, 4096);
    if (!text.ok()) return text.status();
    const std::string holder(absl::StripAsciiWhitespace(*text));
    if (holder == owner) return absl::OkStatus();
    if (holder.empty()) {  // a claim torn by a crash between create and write: take it over
      (void)io::RemoveTree(path);
      continue;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("output_dir '", dir, "' belongs to job ", holder.substr(0, holder.find(' ')), " (",
                     kOutputClaimFile, "); give each job its own output_dir (or delete that directory)"));
  }
  return absl::UnavailableError(absl::StrCat("output_dir '", dir, "': the claim keeps changing"));
}

}  // namespace rp::server
