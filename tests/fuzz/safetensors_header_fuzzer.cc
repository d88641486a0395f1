// libFuzzer target: the safetensors header parser. Input = 8 bytes of data-section size, then
// the header text. Accepted headers must satisfy what the reader relies on.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "workers/files/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_bytes = 0;
  std::memcpy(&data_bytes, data, 8);
  data_bytes %= uint64_t{1} << 40;
  const std::string header(reinterpret_cast<const char*>(data + 8), size - 8);
  auto r = rp::files::ParseSafetensorsHeader(header, data_bytes);
  if (!r.ok()) return 0;
  for (const auto& e : *r) {
    uint64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0) std::abort();
      numel *= static_cast<uint64_t>(d);
    }
    if (e.begin > e.end || e.end > data_bytes || e.element_bytes <= 0) std::abort();
    if (e.end - e.begin != numel * static_cast<uint64_t>(e.element_bytes)) std::abort();
  }
  return 0;
}
