// bounded_json.h — untrusted JSON text (tokenizer.json, JSONL records, config and checkpoint
// files, adapter configs) parsed with its nesting bounded before a value is built
// (base::JsonDepthError's linear scan), then by nlohmann's iterative parser. Deep documents are
// refused by name instead of overflowing a stack in a recursive reader, a copy or a dump later
// on. No LibTorch (the fuzz targets link it alone).
//
// Contract: pure functions, any thread; never throw. Every failure is InvalidArgument naming
// `what` (a file and, for a record, its line) and the limit crossed.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "workers/base/json_depth.h"

namespace rp::files {

// The depth bound, then a parse without exceptions. InvalidArgument "<what>: JSON nested deeper
// than N levels (at byte B)" or "<what>: not valid JSON". The value may be of any type; callers
// check the one they need.
absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, absl::string_view what,
                                                int max_depth = base::kMaxJsonDepth);

// A member of an object by reference (a shared null when `j` is not an object or lacks `key`):
// never copies a subtree, never inserts.
const nlohmann::json& MemberOrNull(const nlohmann::json& j, std::string_view key);

}  // namespace rp::files
