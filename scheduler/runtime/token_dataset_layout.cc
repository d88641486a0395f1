#include "scheduler/runtime/token_dataset_layout.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace rp::scheduler::runtime {
namespace {

bool IsInteger(TokenElement e) { return e != TokenElement::kOther; }

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("token dataset '", path, "'", what));
}

}  // namespace

absl::StatusOr<int64_t> CheckTokenDatasetLayout(const std::string& path, const std::string* format,
                                                const TokenTensor* ids, const TokenTensor* mask,
                                                const TokenTensor* offsets) {
  if (format == nullptr || *format != kTokenDatasetFormat) {
    return Bad(path, absl::StrCat(": __metadata__ \"format\" must be \"", kTokenDatasetFormat, "\" (it is ",
                                  format == nullptr ? std::string("absent") : absl::StrCat("\"", *format, "\""), ")"));
  }
  if (ids == nullptr) return Bad(path, " has no input_ids");
  if (ids->shape.size() != 1 || (ids->element != TokenElement::kInt32 && ids->element != TokenElement::kInt64)) {
    return Bad(path, ": input_ids must be one-dimensional int32 or int64");
  }
  const int64_t n = ids->shape[0];
  if (mask != nullptr && (mask->shape != std::vector<int64_t>{n} || !IsInteger(mask->element))) {
    return Bad(path, absl::StrCat(": loss_mask must be an integer or bool vector as long as input_ids (", n, ")"));
  }
  if (offsets != nullptr &&
      (offsets->shape.size() != 1 || offsets->shape[0] < 2 || offsets->element != TokenElement::kInt64)) {
    return Bad(path, ": document_offsets must be an int64 vector of at least 2");
  }
  return n;
}

absl::Status CheckTokenIds(const std::string& path, const int64_t* ids, int64_t n, int64_t first) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] > std::numeric_limits<int32_t>::max()) {
      return Bad(path, absl::StrCat(": input_ids[", first + i, "] is ", ids[i], " (token ids are in [0, 2^31))"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> DocumentStarts(const std::string& path, const int64_t* o, int64_t k,
                                                    int64_t tokens) {
  for (int64_t i = 0; i < k; ++i) {
    if ((i == 0 && o[i] != 0) || (i > 0 && o[i] < o[i - 1]) || (i == k - 1 && o[i] != tokens)) {
      return Bad(path,
                 absl::StrCat(": document_offsets must rise from 0 to ", tokens, " (entry ", i, " is ", o[i], ")"));
    }
  }
  std::vector<int64_t> starts;
  for (int64_t i = 0; i + 1 < k; ++i) {
    if (o[i] < o[i + 1]) starts.push_back(o[i]);  // empty documents start nothing
  }
  return starts;
}

}  // namespace rp::scheduler::runtime
