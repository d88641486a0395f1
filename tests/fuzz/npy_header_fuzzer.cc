// libFuzzer target: the .npy header parser behind server-side token files. An accepted header
// must describe a payload that lies inside the input (the feeder reads exactly that range).
#include <cstdint>
#include <cstdlib>

#include "workers/files/npy_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = rp::files::ParseNpyHeader(data, size);
  if (!r.ok()) return 0;
  if (r->count < 0 || r->data_offset > size) std::abort();
  const unsigned __int128 end = static_cast<unsigned __int128>(r->data_offset) +
                                static_cast<unsigned __int128>(r->count) * static_cast<unsigned>(r->element_bytes);
  if (end > size) std::abort();
  if (r->count > 0) {  // touch the last payload byte: ASan reports any read past the input
    volatile uint8_t last = data[static_cast<size_t>(end) - 1];
    (void)last;
  }
  return 0;
}
