// transfer_windows.h — (data plane) packing a stage's parameter uploads / gradient downloads into the M
// idle windows between activation transfers (paper §4.2.2).
//
// Contract: pure function; safe from any thread.
// Tensors larger than `split_threshold_bytes` are first cut into near-equal pieces no larger
// than the threshold; then pieces are assigned longest-processing-time first (descending size,
// each to the window with the least bytes so far; ties to the lower window index).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::workers {

struct TensorExtent {
  std::string name;
  int64_t bytes = 0;
};

struct TransferPiece {
  int tensor = 0;      // index into the input
  int64_t offset = 0;  // byte offset within the tensor
  int64_t bytes = 0;
};

struct TransferWindows {
  std::vector<std::vector<TransferPiece>> windows;  // windows[w] in issue order
  std::vector<int64_t> window_bytes;
  int64_t max_piece_bytes = 0;
};

// Errors: no windows, a negative tensor size, a non-positive threshold.
// `split_threshold_bytes` = 0 picks ceil(total / windows) (pieces never exceed a fair share).
absl::StatusOr<TransferWindows> PlanTransferWindows(const std::vector<TensorExtent>& tensors, int num_windows,
                                                    int64_t split_threshold_bytes = 0);

}  // namespace rp::workers
