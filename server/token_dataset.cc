#include "server/token_dataset.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rp::server {

namespace {

// Parses a .npy header; sets the payload offset, element size/signedness and element count.
absl::Status ParseNpy(const unsigned char* p, size_t size, size_t* offset, int* bytes, bool* is_signed,
                      int64_t* count) {
  if (size < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0)
    return absl::InvalidArgumentError("not a .npy file (bad magic)");
  const int major = p[6];
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = p[8] | (p[9] << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return absl::InvalidArgumentError(".npy: truncated header");
    header_len = static_cast<size_t>(p[8]) | (static_cast<size_t>(p[9]) << 8) | (static_cast<size_t>(p[10]) << 16) |
                 (static_cast<size_t>(p[11]) << 24);
    start = 12;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(".npy: unsupported version ", major));
  }
  if (start + header_len > size) return absl::InvalidArgumentError(".npy: header runs past the end of the file");
  const std::string header(reinterpret_cast<const char*>(p + start), header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([<>|=]?)([uif])(\\d)'"))) {
    return absl::InvalidArgumentError(".npy: no descr in header");
  }
  if (m[1] == ">") return absl::InvalidArgumentError(".npy: big-endian data is not supported");
  const std::string kind = m[2];
  const int b = std::stoi(m[3]);
  if (kind == "f" || (kind == "u" && b != 2 && b != 4) || (kind == "i" && b != 4 && b != 8)) {
    return absl::InvalidArgumentError(
        absl::StrCat(".npy: token dtype ", kind, b, " not supported (use uint16, uint32, int32 or int64)"));
  }
  if (absl::StrContains(header, "'fortran_order': True")) {
    return absl::InvalidArgumentError(".npy: fortran_order arrays are not supported");
  }
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)"))) {
    return absl::InvalidArgumentError(".npy: no shape in header");
  }
  int64_t n = 1;
  const std::string dims = m[1];
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    n *= std::stoll(it->str());
  }
  *offset = start + header_len;
  *bytes = b;
  *is_signed = kind == "i";
  *count = n;
  if (*offset + static_cast<size_t>(n) * b > size) {
    return absl::InvalidArgumentError(".npy: the shape promises more data than the file holds");
  }
  return absl::OkStatus();
}

}  // namespace

TokenDataset::~TokenDataset() {
  if (map_) munmap(const_cast<unsigned char*>(map_), map_size_);
}

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(const std::string& path, TokenFileFormat format,
                                                                 int64_t global_batch, int64_t sequence_length) {
  if (global_batch < 1 || sequence_length < 1) return absl::InvalidArgumentError("dataset: empty batch shape");
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("token file '", path, "': ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' is not a regular file"));
  }
  std::unique_ptr<TokenDataset> d(new TokenDataset());
  d->map_size_ = static_cast<size_t>(st.st_size);
  if (d->map_size_ > 0) {
    void* m = mmap(nullptr, d->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("token file '", path, "': mmap: ", std::strerror(errno)));
    }
    d->map_ = static_cast<const unsigned char*>(m);
  }
  ::close(fd);
  if (format == TokenFileFormat::kAuto) {
    format = absl::EndsWith(path, ".npy") ? TokenFileFormat::kNpy : TokenFileFormat::kBinUint16;
  }
  if (format == TokenFileFormat::kNpy) {
    size_t offset = 0;
    if (absl::Status s = ParseNpy(d->map_, d->map_size_, &offset, &d->element_bytes_, &d->is_signed_, &d->num_tokens_);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("token file '", path, "': ", s.message()));
    }
    d->data_ = d->map_ + offset;
  } else {
    d->element_bytes_ = format == TokenFileFormat::kBinUint32 ? 4 : 2;
    if (d->map_size_ % d->element_bytes_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat("token file '", path, "': ", d->map_size_,
                                                     " bytes is not a whole number of uint", 8 * d->element_bytes_,
                                                     " tokens (wrong format?)"));
    }
    d->data_ = d->map_;
    d->num_tokens_ = static_cast<int64_t>(d->map_size_ / d->element_bytes_);
  }
  d->global_batch_ = global_batch;
  d->sequence_length_ = sequence_length;
  const int64_t windows = d->num_tokens_ > 1 ? (d->num_tokens_ - 1) / sequence_length : 0;
  d->batches_per_epoch_ = windows / global_batch;
  if (d->batches_per_epoch_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat("token file '", path, "' holds ", d->num_tokens_,
                                                   " tokens, not enough for one batch of ", global_batch, " x ",
                                                   sequence_length + 1));
  }
  return d;
}

int64_t TokenDataset::TokenAt(int64_t i) const {
  const unsigned char* p = data_ + i * element_bytes_;
  switch (element_bytes_) {
    case 2:
      return static_cast<int64_t>(p[0] | (p[1] << 8));
    case 4: {
      uint32_t v = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                   (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
      return is_signed_ ? static_cast<int64_t>(static_cast<int32_t>(v)) : static_cast<int64_t>(v);
    }
    default: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

std::pair<at::Tensor, at::Tensor> TokenDataset::Batch(int64_t index) const {
  const int64_t B = global_batch_, S = sequence_length_;
  at::Tensor tokens = at::empty({B, S}, at::kLong), labels = at::empty({B, S}, at::kLong);
  int64_t* t = tokens.data_ptr<int64_t>();
  int64_t* l = labels.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = ((index % batches_per_epoch_) * B + b) * S;
    for (int64_t s = 0; s < S; ++s) {
      t[b * S + s] = TokenAt(start + s);
      l[b * S + s] = TokenAt(start + s + 1);
    }
  }
  return {tokens, labels};
}

}  // namespace rp::server
