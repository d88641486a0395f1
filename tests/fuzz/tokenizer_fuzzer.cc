// libFuzzer target: tokenizer.json (workers/text). Whatever the file, FromJson returns a status
// without crashing or allocating beyond what the file holds; an accepted tokenizer encodes a
// sample with its limits (a catastrophic pre-tokenizer pattern is bounded by the deadline) and
// every id it gives lies below IdLimit, which Submit checks against the model's vocabulary.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "workers/text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto t = rp::workers::text::Tokenizer::FromJson(std::string(reinterpret_cast<const char*>(data), size));
  if (!t.ok()) return 0;
  rp::workers::text::WorkLimits limits;
  limits.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  auto ids = t->Encode("Hello, world! aaaa bbb 123 \xc3\xbc\xe2\x82\xac <s> \xff end", true, limits);
  if (!ids.ok()) return 0;
  for (int32_t id : *ids) {
    if (id < 0 || id >= t->IdLimit()) std::abort();
  }
  (void)t->Decode(*ids);
  return 0;
}
