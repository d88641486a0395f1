// A file's SHA-256 (file_digest.h), by OpenSSL's EVP interface.
#include "server/file_digest.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace rp::server {

absl::StatusOr<std::string> Sha256OfFile(const std::string& path, const std::function<bool()>& stop) {
  // Non-blocking open: a FIFO must not hold the caller; then only a regular file is read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    const std::string why = absl::StrCat("'", path, "': ", std::strerror(e));
    if (e == ENOENT) return absl::NotFoundError(why);
    if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(why);
    return absl::InvalidArgumentError(why);
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    return absl::InternalError("SHA-256: OpenSSL could not start a digest");
  }
  std::vector<unsigned char> buf(size_t{4} << 20);
  for (;;) {
    if (stop && stop()) return absl::CancelledError(absl::StrCat("hashing '", path, "' was stopped"));
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat("reading '", path, "': ", std::strerror(errno)));
    if (n == 0) break;
    if (EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n)) != 1) {
      return absl::InternalError("SHA-256: OpenSSL failed on a chunk");
    }
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) return absl::InternalError("SHA-256: OpenSSL could not finish");
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(md), len));
}

}  // namespace rp::server
