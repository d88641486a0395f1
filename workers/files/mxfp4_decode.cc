#include "workers/files/mxfp4_decode.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rp::files {

absl::StatusOr<int64_t> CheckMxfp4Shapes(const std::vector<int64_t>& blocks, const std::vector<int64_t>& scales) {
  auto mismatch = [&] {
    return absl::InvalidArgumentError(absl::StrCat("MXFP4: blocks [", absl::StrJoin(blocks, ", "), "] must be scales [",
                                                   absl::StrJoin(scales, ", "), "] plus a last dimension of 16 bytes"));
  };
  if (blocks.size() < 2 || blocks.back() != 16 || scales.size() != blocks.size() - 1) return mismatch();
  int64_t groups = 1;
  for (size_t i = 0; i < scales.size(); ++i) {
    if (scales[i] != blocks[i] || scales[i] < 0) return mismatch();
    if (scales[i] != 0 && groups > (INT64_MAX / 32) / scales[i]) {
      return absl::InvalidArgumentError("MXFP4: the tensor has more values than int64 counts");
    }
    groups *= scales[i];
  }
  return groups;
}

}  // namespace rp::files
