// libFuzzer target: JSONL dataset records (workers/text/jsonl_record.cc), each line parsed and,
// when accepted, tokenized by a small byte-level BPE tokenizer under a deadline, as the engine's
// dataset reader does. Every id lies below the tokenizer's IdLimit.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "workers/text/jsonl_record.h"
#include "workers/text/tokenizer.h"

namespace {

const rp::workers::text::Tokenizer& SmallTokenizer() {
  static const auto* tok = [] {
    auto t = rp::workers::text::Tokenizer::FromJson(
        R"({"added_tokens":[{"id":6,"content":"<s>","special":true}],)"
        R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},)"
        R"("decoder":{"type":"ByteLevel"},)"
        R"("model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"c":4,"Ġa":5},"merges":["a b","Ġ a"]}})");
    if (!t.ok()) std::abort();
    return new rp::workers::text::Tokenizer(*std::move(t));
  }();
  return *tok;
}

void Encode(const std::string& text, bool special) {
  rp::workers::text::WorkLimits limits;
  limits.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  auto ids = SmallTokenizer().Encode(text, special, limits);
  if (!ids.ok()) return;
  for (int32_t id : *ids) {
    if (id < 0 || id >= SmallTokenizer().IdLimit()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  while (!all.empty()) {
    const size_t nl = all.find('\n');
    const std::string_view line = all.substr(0, nl);
    all = nl == std::string_view::npos ? std::string_view() : all.substr(nl + 1);
    auto rec = rp::workers::text::ParseJsonlRecord(line);
    if (!rec.ok()) continue;
    if (rec->has_prompt) Encode(rec->prompt, true);
    Encode(rec->text, !rec->has_prompt);
  }
  return 0;
}
