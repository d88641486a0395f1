// frozen_base.h — what a checkpoint records of the parameters a job does not train (a LoRA job's
// base) instead of their values: per frozen parameter its name, dtype, shape and a CRC-32 of the
// bytes workers upload (its master copy), and one fingerprint over all of them. A resumed job
// proves it runs on the same base by recomputing the record from the base it loaded; a base
// parameter read after the job ended (from model.hf_dir) is checked against its entry.
//
// Contract: pure functions. Describe reads every frozen byte once (tensors cut into 16 MiB
// pieces, CRCs over ATen's intra-op threads, combined in order), so it must not run while the
// store's masters are written; the frozen masters never are once a job is built. CRC-32 finds an
// altered or different base, not a forged one: a fingerprint, not a signature.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::workers {
class HostModelStore;
}

namespace rp::workers::io {

struct FrozenTensor {
  std::string name;
  std::string dtype;  // "BF16", "F16", "F32": the master dtype (safetensors spelling)
  std::vector<int64_t> shape;
  uint32_t crc32 = 0;  // of the master copy's bytes, row-major
  bool operator==(const FrozenTensor&) const = default;
};

struct FrozenBase {
  std::vector<FrozenTensor> tensors;  // in parameter order
  int64_t bytes = 0;                  // sum of the tensors' bytes
  std::string fingerprint;            // 8 hex digits over every entry; empty when nothing is frozen

  bool empty() const { return tensors.empty(); }
  const FrozenTensor* Find(const std::string& name) const;  // null if absent
};

// The frozen parameters of `store` (trainable == false), in parameter order.
FrozenBase DescribeFrozenBase(const HostModelStore& store);

// CRC-32 of a contiguous or strided CPU tensor's values as row-major bytes.
uint32_t TensorCrc32(const at::Tensor& t);

// OK when `actual` is the base `recorded` was made from; otherwise FailedPrecondition naming the
// first tensor that differs (missing, another dtype or shape, other values) and what to do.
absl::Status SameFrozenBase(const FrozenBase& recorded, const FrozenBase& actual, const std::string& what);

// JSON text of the record (base.json of a checkpoint) and back. Parse fails with DataLoss on any
// damage, including a fingerprint that does not match the entries.
std::string FrozenBaseJson(const FrozenBase& base);
absl::StatusOr<FrozenBase> ParseFrozenBaseJson(const std::string& text);

}  // namespace rp::workers::io
