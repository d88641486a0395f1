// libFuzzer target: the Hugging Face config.json parser. Any accepted config must be one the
// engine's own validation accepts.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "workers/io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = rp::files::ParseHfConfig(std::string(reinterpret_cast<const char*>(data), size));
  if (r.ok() && !r->Validate().ok()) std::abort();
  return 0;
}
