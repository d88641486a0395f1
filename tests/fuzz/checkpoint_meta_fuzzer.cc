// libFuzzer target: a checkpoint's meta.json (workers/files/checkpoint_meta.cc). Whatever the text,
// ParseCheckpointMeta returns a status; an accepted meta has a non-negative step and data cursor,
// partition entries in [0, 2^20] and, when present, a complete eval record.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "workers/files/checkpoint_meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = rp::files::ParseCheckpointMeta(std::string(reinterpret_cast<const char*>(data), size), "ckpt");
  if (!f.ok()) return 0;
  const auto& m = f->meta;
  if (m.step < 0 || m.batches_consumed < 0 || m.optimizer.empty()) std::abort();
  if (m.fused < 0 || m.fused > (1 << 20)) std::abort();
  for (const auto* side : {&m.forward, &m.backward}) {
    for (int v : *side) {
      if (v < 0 || v > (1 << 20)) std::abort();
    }
  }
  if (m.eval && (m.eval->step < 0 || m.eval->tokens < 0 || m.eval->best_step < 0 || m.eval->without_improvement < 0)) {
    std::abort();
  }
  return 0;
}
