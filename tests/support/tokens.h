// tokens.h — deterministic random token batches for engine tests and benchmarks.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace rp::testing {

// [batch, seq] int64 ids in [0, vocab), reproducible from `seed`.
inline at::Tensor RandomTokens(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {batch, seq}, gen, at::TensorOptions().dtype(at::kLong));
}

}  // namespace rp::testing
