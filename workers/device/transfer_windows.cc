#include "workers/device/transfer_windows.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rp::workers {

absl::StatusOr<TransferWindows> PlanTransferWindows(const std::vector<TensorExtent>& tensors, int num_windows,
                                                    int64_t threshold) {
  if (num_windows < 1) {
    return absl::InvalidArgumentError(absl::StrCat("transfer windows: need at least one window, got ", num_windows));
  }
  if (threshold < 0) {
    return absl::InvalidArgumentError(absl::StrCat("transfer windows: split threshold must be >= 0, got ", threshold));
  }
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer windows: tensor '", tensors[i].name, "' has negative size ", tensors[i].bytes));
    }
    total += tensors[i].bytes;
  }
  if (threshold == 0) threshold = std::max<int64_t>(1, (total + num_windows - 1) / num_windows);

  std::vector<TransferPiece> pieces;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t b = tensors[i].bytes;
    if (b == 0) continue;
    const int64_t n = (b + threshold - 1) / threshold;
    const int64_t base = b / n, extra = b % n;  // first `extra` pieces get one more byte
    int64_t off = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t sz = base + (k < extra ? 1 : 0);
      pieces.push_back({static_cast<int>(i), off, sz});
      off += sz;
    }
  }
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const TransferPiece& a, const TransferPiece& b) { return a.bytes > b.bytes; });
  TransferWindows out;
  out.windows.resize(static_cast<size_t>(num_windows));
  out.window_bytes.assign(static_cast<size_t>(num_windows), 0);
  for (const TransferPiece& p : pieces) {
    const auto it = std::min_element(out.window_bytes.begin(), out.window_bytes.end());
    const size_t w = static_cast<size_t>(it - out.window_bytes.begin());
    out.windows[w].push_back(p);
    out.window_bytes[w] += p.bytes;
    out.max_piece_bytes = std::max(out.max_piece_bytes, p.bytes);
  }
  return out;
}

}  // namespace rp::workers
