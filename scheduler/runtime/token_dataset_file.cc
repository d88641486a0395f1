#include "scheduler/runtime/token_dataset_file.h"

#include <ATen/ATen.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "workers/io/safetensors_reader.h"

namespace rp::scheduler::runtime {
namespace {

constexpr const char* kTokenDatasetFormat = "roundpipe.token_dataset.v1";

bool IsInteger(at::ScalarType t) {
  return t == at::kInt || t == at::kLong || t == at::kByte || t == at::kBool || t == at::kShort;
}

absl::StatusOr<std::unique_ptr<workers::io::SafetensorsFile>> OpenChecked(const std::string& path, int64_t* n) {
  auto f = workers::io::SafetensorsFile::Open(path);
  if (!f.ok()) return absl::InvalidArgumentError(absl::StrCat("token dataset: ", f.status().message()));
  const auto& meta = (*f)->metadata();
  if (auto fmt = meta.find("format"); fmt == meta.end() || fmt->second != kTokenDatasetFormat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token dataset '", path, "': __metadata__ \"format\" must be \"", kTokenDatasetFormat, "\" (it is ",
        fmt == meta.end() ? std::string("absent") : absl::StrCat("\"", fmt->second, "\""), ")"));
  }
  const auto* ids = (*f)->Find("input_ids");
  if (ids == nullptr) return absl::InvalidArgumentError(absl::StrCat("token dataset '", path, "' has no input_ids"));
  if (ids->shape.size() != 1 || (ids->dtype != at::kInt && ids->dtype != at::kLong)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token dataset '", path, "': input_ids must be one-dimensional int32 or int64"));
  }
  *n = ids->shape[0];
  if (const auto* m = (*f)->Find("loss_mask")) {
    if (m->shape != std::vector<int64_t>{*n} || !IsInteger(m->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("token dataset '", path, "': loss_mask must be an integer or ",
                                                     "bool vector as long as input_ids (", *n, ")"));
    }
  }
  if (const auto* d = (*f)->Find("document_offsets")) {
    if (d->shape.size() != 1 || d->shape[0] < 2 || d->dtype != at::kLong) {
      return absl::InvalidArgumentError(
          absl::StrCat("token dataset '", path, "': document_offsets must be an int64 vector of at least 2"));
    }
  }
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
  for (int64_t i = 0; i < n; ++i) {
    if ((i & ((int64_t{1} << 20) - 1)) == 0 && stopped()) return stopped_error();
    if (p[i] < 0 || p[i] > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token dataset '", path, "': input_ids[", i, "] is ", p[i], " (token ids are in [0, 2^31))"));
    }
    out.tokens[static_cast<size_t>(i)] = static_cast<int32_t>(p[i]);
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
    const int64_t* o = d->data_ptr<int64_t>();
    const int64_t k = d->numel();
    for (int64_t i = 0; i < k; ++i) {
      if ((i == 0 && o[i] != 0) || (i > 0 && o[i] < o[i - 1]) || (i == k - 1 && o[i] != n)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token dataset '", path, "': document_offsets must rise from 0 to ", n, " (entry ", i, " is ", o[i], ")"));
      }
    }
    out.documents = k - 1;
    out.document_starts.clear();
    for (int64_t i = 0; i + 1 < k; ++i) {
      if (o[i] < o[i + 1]) out.document_starts.push_back(o[i]);  // empty documents start nothing
    }
  }
  return out;
}

}  // namespace rp::scheduler::runtime
