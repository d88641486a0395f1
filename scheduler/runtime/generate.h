// generate.h — text generation from a job's current weights through its own pipeline
// (Controller::LastLogits): several prompts at once, greedy or sampled with a seed.
//
// Without a KV cache: each new token is one forward pass over every prompt and what it generated
// so far. Sample generations are short (tens of tokens) and run only at evaluations, so the
// quadratic cost is small next to training, and a cache would have to live on the stateless
// workers between passes (or travel like activations) for a result that must equal a plain
// forward anyway; the plain pass is exact by construction (the same stage math as training).
// Prompts of different lengths share a pass: a row's left padding is a document of its own
// (positions restart where the prompt begins), so attention, rope and sliding windows see each
// prompt exactly as if it were alone.
//
// Contract: called between iterations by the thread that drives the controller.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/runtime/controller.h"

namespace rp::scheduler::runtime {

struct GenerateOptions {
  int max_new_tokens = 32;
  // 0: greedy (the highest logit; the lowest id among equals). > 0: sampled from
  // softmax(logits / temperature), each prompt with a generator of its own seeded by `seed` and
  // its index in the list: its sample does not depend on the other prompts' draws.
  double temperature = 0;
  uint64_t seed = 0;
  std::vector<int32_t> stop_tokens;  // a prompt ends after generating one of these (it is kept)
};

// The generated ids of each prompt (the prompt itself not included). `microbatches`: the
// controller's M (rows are padded to a multiple of it). `stop`: polled between tokens; true ends
// with Cancelled.
absl::StatusOr<std::vector<std::vector<int32_t>>> Generate(Controller& controller,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const GenerateOptions& options, int microbatches,
                                                           const std::function<bool()>& stop = {});

// One token from a row of logits (exposed for tests): argmax at temperature 0, else a draw with
// `uniform` in [0, 1) from softmax(logits / temperature).
int32_t PickToken(const float* logits, int64_t vocab, double temperature, double uniform);

}  // namespace rp::scheduler::runtime
