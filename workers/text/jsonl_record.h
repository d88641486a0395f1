// jsonl_record.h — one line of a JSONL text dataset as typed fields: {"text": ...} (trained
// whole) or {"prompt": ..., "completion": ...} (only the completion trained). Tokenizing is the
// caller's (workers/text/tokenizer.h). No LibTorch: the JSONL fuzzer builds this file alone.
//
// Contract: a pure function, any thread, never throws. The line is untrusted: nesting is bounded
// (64 levels) before parsing; errors name the field, never the line (the caller adds file and line).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace rp::workers::text {

struct JsonlRecord {
  bool has_prompt = false;  // false: `text` is the whole document
  std::string text;         // the document, or the completion when has_prompt
  std::string prompt;
};

absl::StatusOr<JsonlRecord> ParseJsonlRecord(std::string_view line);

}  // namespace rp::workers::text
