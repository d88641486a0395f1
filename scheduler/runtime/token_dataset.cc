#include "scheduler/runtime/token_dataset.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "workers/files/confined_fs.h"
#include "workers/files/npy_header.h"

namespace rp::scheduler::runtime {

TokenDataset::~TokenDataset() {
  if (map_) munmap(const_cast<unsigned char*>(map_), map_size_);
}

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(const std::string& path, TokenFileFormat format,
                                                                 int64_t global_batch, int64_t sequence_length) {
  if (global_batch < 1 || sequence_length < 1) return absl::InvalidArgumentError("dataset: empty batch shape");
  // A regular file beneath the daemon's roots, opened at use (confined_fs): no FIFO, no escape.
  uint64_t bytes = 0;
  auto fd = files::OpenForRead(path, &bytes);
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
    auto layout = files::ParseNpyHeader(d->map_, d->map_size_);
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
  if (auto st = d->SetShape(global_batch, sequence_length, absl::StrCat("token file '", path, "'")); !st.ok())
    return st;
  return d;
}

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::FromPacked(std::vector<int32_t> tokens,
                                                                       std::vector<uint8_t> trained,
                                                                       int64_t global_batch, int64_t sequence_length,
                                                                       const std::string& what) {
  if (global_batch < 1 || sequence_length < 1) return absl::InvalidArgumentError("dataset: empty batch shape");
  if (tokens.size() != trained.size()) return absl::InternalError("dataset: mask and tokens differ in length");
  std::unique_ptr<TokenDataset> d(new TokenDataset());
  d->element_bytes_ = 0;
  d->num_tokens_ = static_cast<int64_t>(tokens.size());
  d->packed_ = std::move(tokens);
  d->trained_ = std::move(trained);
  if (auto st = d->SetShape(global_batch, sequence_length, what); !st.ok()) return st;
  return d;
}

absl::Status TokenDataset::SetShape(int64_t global_batch, int64_t sequence_length, const std::string& what) {
  global_batch_ = global_batch;
  first_row_ = 0;
  rows_ = global_batch;
  sequence_length_ = sequence_length;
  const int64_t windows = num_tokens_ > 1 ? (num_tokens_ - 1) / sequence_length : 0;
  batches_per_epoch_ = windows / global_batch;
  if (batches_per_epoch_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " holds ", num_tokens_,
                                                   " tokens, not enough for one batch of ", global_batch, " x ",
                                                   sequence_length + 1));
  }
  return absl::OkStatus();
}

namespace {

// A keyed bijection of [0, n): a 4-round Feistel network over the smallest even-bit power of two
// >= n, cycle-walked back into range (at most ~4 steps on average). O(1) memory per epoch.
int64_t Permute(uint64_t i, uint64_t n, uint64_t key) {
  int half = 1;
  while ((uint64_t{1} << (2 * half)) < n) ++half;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  auto mix = [](uint64_t x) {  // splitmix64's finaliser
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  do {
    uint64_t l = i >> half, r = i & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = mix(r ^ mix(key + round)) & mask;
      const uint64_t t = l ^ f;
      l = r;
      r = t;
    }
    i = (l << half) | r;
  } while (i >= n);
  return static_cast<int64_t>(i);
}

}  // namespace

int64_t TokenDataset::WindowOf(int64_t index, int64_t row) const {
  const int64_t in_epoch = (index % batches_per_epoch_) * global_batch_ + row;
  if (!shuffle_) return in_epoch;
  // Every window of the epoch can be drawn, also those a drop-last epoch leaves out in file order.
  const int64_t windows = (num_tokens_ - 1) / sequence_length_;
  const uint64_t epoch = static_cast<uint64_t>(index / batches_per_epoch_);
  return Permute(static_cast<uint64_t>(in_epoch), static_cast<uint64_t>(windows),
                 seed_ * 0x9e3779b97f4a7c15ull + epoch);
}

int64_t TokenDataset::TokenAt(int64_t i) const {
  if (element_bytes_ == 0) return packed_[i];
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
  const int64_t B = rows_, S = sequence_length_;
  at::Tensor tokens = at::empty({B, S}, at::kLong), labels = at::empty({B, S}, at::kLong);
  int64_t* t = tokens.data_ptr<int64_t>();
  int64_t* l = labels.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = WindowOf(index, first_row_ + b) * S;
    for (int64_t s = 0; s < S; ++s) {
      t[b * S + s] = TokenAt(start + s);
      const bool target =
          (trained_.empty() || trained_[start + s + 1] != 0) && !(mask_documents_ && StartsDocument(start + s + 1));
      l[b * S + s] = target ? TokenAt(start + s + 1) : scheduler::Batch::kIgnoreLabel;
    }
  }
  return {tokens, labels};
}

absl::Status TokenDataset::TakeShare(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size || global_batch_ % size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch ", global_batch_, " cannot be split evenly over ", size, " data-parallel nodes"));
  }
  rows_ = global_batch_ / size;
  first_row_ = rank * rows_;
  return absl::OkStatus();
}

bool TokenDataset::StartsDocument(int64_t i) const {
  return std::binary_search(document_starts_.begin(), document_starts_.end(), i);
}

at::Tensor TokenDataset::Positions(int64_t index) const {
  if (!mask_documents_) return at::Tensor();
  const int64_t B = rows_, S = sequence_length_;
  at::Tensor positions = at::empty({B, S}, at::kLong);
  int64_t* p = positions.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = WindowOf(index, first_row_ + b) * S;
    // The document starts inside the window, walked in order.
    auto next = std::upper_bound(document_starts_.begin(), document_starts_.end(), start);
    int64_t pos = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (s > 0 && next != document_starts_.end() && *next == start + s) {
        pos = 0;
        ++next;
      }
      p[b * S + s] = pos++;
    }
  }
  return positions;
}

}  // namespace rp::scheduler::runtime
