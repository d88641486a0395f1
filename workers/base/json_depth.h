// json_depth.h — the nesting depth of untrusted JSON text, measured before anything parses it:
// one linear scan, no allocation, no recursion. Every reader of untrusted JSON (tokenizer files,
// JSONL records, configs, checkpoints' metadata, profiles) refuses text deeper than its bound, so
// no recursive walk, copy or dump of the parsed value can overflow a thread's stack.
// (workers/files/bounded_json.h pairs it with the parse; the planning library, which sees only
// this foundation, calls it directly.)
//
// Contract: a pure function, any thread, never throws.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace rp::base {

// Deeper than any real configuration (Hugging Face files nest under 10 levels, a chat record 4)
// and far below what a recursive walk of the value can take on a thread's stack.
inline constexpr int kMaxJsonDepth = 64;

// Empty when `text` nests arrays and objects at most `max_depth` deep (strings and their escapes
// skipped; unbalanced text is left to the parser); otherwise "JSON nested deeper than N levels
// (at byte B)", the scan stopping at the first bracket beyond the bound.
inline std::string JsonDepthError(std::string_view text, int max_depth = kMaxJsonDepth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return "JSON nested deeper than " + std::to_string(max_depth) + " levels (at byte " + std::to_string(i) + ")";
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return {};
}

}  // namespace rp::base
