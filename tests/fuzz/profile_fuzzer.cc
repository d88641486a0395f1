// libFuzzer target: a profile JSON (roundpipe.profile.v1, scheduler/planning). Whatever the text,
// ParseProfile returns a status; an accepted profile has finite non-negative times and writes
// back (ProfileJson) to a text that parses to the same layers.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "scheduler/planning/profile_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto p = rp::planning::ParseProfile(std::string(reinterpret_cast<const char*>(data), size));
  if (!p.ok()) return 0;
  const auto& layers = p->costs.layers;
  if (layers.empty()) std::abort();
  for (const auto& l : layers) {
    for (double t : {l.fwd_s, l.bwd_s, l.fused_s}) {
      if (!std::isfinite(t) || t < 0) std::abort();
    }
  }
  auto again = rp::planning::ParseProfile(rp::planning::ProfileJson(*p));
  if (!again.ok() || again->costs.layers.size() != layers.size()) std::abort();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (again->costs.layers[i].fwd_s != layers[i].fwd_s || again->costs.layers[i].bwd_s != layers[i].bwd_s ||
        again->costs.layers[i].kind != layers[i].kind) {
      std::abort();
    }
  }
  return 0;
}
