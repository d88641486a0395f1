// libFuzzer target: a PEFT adapter_config.json (workers/files/peft_config_parse.cc). Whatever the
// text, ParsePeftConfig returns a status; an accepted config has a rank in [1, 65536] and a
// finite alpha. ParsePeftBaseModel returns a status too, and its name compares with itself and
// with a model directory without touching anything but the name (SameBaseModel).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "workers/io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (auto base = rp::files::ParsePeftBaseModel(text); base.ok()) {
    if (!rp::files::SameBaseModel(*base, *base)) std::abort();
    (void)rp::files::SameBaseModel(*base, "/nonexistent/models/base");
  }
  auto c = rp::files::ParsePeftConfig(text);
  if (!c.ok()) return 0;
  if (c->rank < 1 || c->rank > 65536) std::abort();
  if (!std::isfinite(c->alpha)) std::abort();
  return 0;
}
