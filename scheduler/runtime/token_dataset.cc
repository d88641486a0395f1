#include "scheduler/runtime/token_dataset.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "workers/io/confined_fs.h"
#include "workers/io/npy_header.h"

namespace rp::scheduler::runtime {

TokenDataset::~TokenDataset() {
  if (map_) munmap(const_cast<unsigned char*>(map_), map_size_);
}

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(const std::string& path, TokenFileFormat format,
                                                                 int64_t global_batch, int64_t sequence_length) {
  if (global_batch < 1 || sequence_length < 1) return absl::InvalidArgumentError("dataset: empty batch shape");
  // A regular file beneath the daemon's roots, opened at use (confined_fs): no FIFO, no escape.
  uint64_t bytes = 0;
  auto fd = workers::io::OpenForRead(path, &bytes);
  if (!fd.ok()) return absl::Status(fd.status().code(), absl::StrCat("token file: ", fd.status().message()));
  std::unique_ptr<TokenDataset> d(new TokenDataset());
  d->map_size_ = static_cast<size_t>(bytes);
  if (d->map_size_ > 0) {
    void* m = mmap(nullptr, d->map_size_, PROT_READ, MAP_PRIVATE, fd->get(), 0);
    if (m == MAP_FAILED) {
      return absl::InternalError(absl::StrCat("token file '", path, "': mmap: ", std::strerror(errno)));
    }
    d->map_ = static_cast<const unsigned char*>(m);
  }
  if (format == TokenFileFormat::kAuto) {
    format = absl::EndsWith(path, ".npy") ? TokenFileFormat::kNpy : TokenFileFormat::kBinUint16;
  }
  if (format == TokenFileFormat::kNpy) {
    auto layout = workers::io::ParseNpyHeader(d->map_, d->map_size_);
    if (!layout.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("token file '", path, "': ", layout.status().message()));
    }
    d->element_bytes_ = layout->element_bytes;
    d->is_signed_ = layout->is_signed;
    d->num_tokens_ = layout->count;
    d->data_ = d->map_ + layout->data_offset;
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

}  // namespace rp::scheduler::runtime
