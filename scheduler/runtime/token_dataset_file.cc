#include "scheduler/runtime/token_dataset_file.h"

#include <ATen/ATen.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "scheduler/runtime/token_dataset_layout.h"
#include "workers/io/safetensors_reader.h"

namespace rp::scheduler::runtime {
namespace {

TokenElement ElementOf(at::ScalarType t) {
  switch (t) {
    case at::kInt:
      return TokenElement::kInt32;
    case at::kLong:
      return TokenElement::kInt64;
    case at::kByte:
      return TokenElement::kUInt8;
    case at::kBool:
      return TokenElement::kBool;
    case at::kShort:
      return TokenElement::kInt16;
    default:
      return TokenElement::kOther;
  }
}

std::optional<TokenTensor> TensorOf(const workers::io::SafetensorsFile& f, const char* name) {
  const workers::io::TensorInfo* info = f.Find(name);
  if (info == nullptr) return std::nullopt;
  return TokenTensor{ElementOf(info->dtype), info->shape};
}

absl::StatusOr<std::unique_ptr<workers::io::SafetensorsFile>> OpenChecked(const std::string& path, int64_t* n) {
  auto f = workers::io::SafetensorsFile::Open(path);
  if (!f.ok()) return absl::InvalidArgumentError(absl::StrCat("token dataset: ", f.status().message()));
  const auto& meta = (*f)->metadata();
  const auto fmt = meta.find("format");
  const auto ids = TensorOf(**f, "input_ids"), mask = TensorOf(**f, "loss_mask"),
             offsets = TensorOf(**f, "document_offsets");
  auto tokens = CheckTokenDatasetLayout(path, fmt == meta.end() ? nullptr : &fmt->second, ids ? &*ids : nullptr,
                                        mask ? &*mask : nullptr, offsets ? &*offsets : nullptr);
  if (!tokens.ok()) return tokens.status();
  *n = *tokens;
  return f;
}

}  // namespace

absl::Status CheckTokenDatasetFile(const std::string& path) {
  int64_t n = 0;
  auto f = OpenChecked(path, &n);
  return f.ok() ? absl::OkStatus() : f.status();
}

absl::StatusOr<PackedTokens> ReadTokenDatasetFile(const std::string& path, const std::atomic<bool>* stop) {
  auto stopped = [&] { return stop != nullptr && stop->load(std::memory_order_relaxed); };
  auto stopped_error = [&] { return absl::CancelledError(absl::StrCat("reading '", path, "' was stopped")); };
  if (stopped()) return stopped_error();
  int64_t n = 0;
  auto f = OpenChecked(path, &n);
  if (!f.ok()) return f.status();
  // Read in the file's own dtype and range-checked here: a cast would wrap 2^32 + 5 to 5.
  auto ids = (*f)->Read("input_ids", at::kLong);
  if (!ids.ok()) return ids.status();
  PackedTokens out;
  const int64_t* p = ids->data_ptr<int64_t>();
  out.tokens.resize(static_cast<size_t>(n));
  constexpr int64_t kChunk = int64_t{1} << 20;  // the stop flag is polled between chunks
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    if (stopped()) return stopped_error();
    const int64_t count = std::min(kChunk, n - begin);
    if (absl::Status st = CheckTokenIds(path, p + begin, count, begin); !st.ok()) return st;
    for (int64_t i = begin; i < begin + count; ++i) out.tokens[static_cast<size_t>(i)] = static_cast<int32_t>(p[i]);
  }
  out.trained.assign(static_cast<size_t>(n), 1);
  if ((*f)->Find("loss_mask") != nullptr) {
    // Compared with zero in its own dtype widened (an int32 mask of 256 is 1, not a wrapped 0).
    auto m = (*f)->Read("loss_mask", at::kLong);
    if (!m.ok()) return m.status();
    const int64_t* q = m->data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) out.trained[i] = q[i] != 0 ? 1 : 0;
  }
  out.documents = 1;
  out.document_starts = {0};
  if ((*f)->Find("document_offsets") != nullptr) {
    auto d = (*f)->Read("document_offsets", at::kLong);
    if (!d.ok()) return d.status();
    auto starts = DocumentStarts(path, d->data_ptr<int64_t>(), d->numel(), n);
    if (!starts.ok()) return starts.status();
    out.documents = d->numel() - 1;
    out.document_starts = *std::move(starts);
  }
  return out;
}

}  // namespace rp::scheduler::runtime
