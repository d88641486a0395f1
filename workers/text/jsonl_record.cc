#include "workers/text/jsonl_record.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "workers/base/json_depth.h"

namespace rp::workers::text {

absl::StatusOr<JsonlRecord> ParseJsonlRecord(std::string_view line) {
  using Json = nlohmann::json;
  if (std::string deep = base::JsonDepthError(line); !deep.empty()) return absl::InvalidArgumentError(deep);
  const Json rec = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (rec.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!rec.is_object()) return absl::InvalidArgumentError("not a JSON object");
  auto field = [&](const char* key, std::string* out) -> absl::Status {
    auto it = rec.find(key);
    if (it == rec.end() || !it->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("field \"", key, "\" must be a string"));
    }
    *out = it->get<std::string>();
    return absl::OkStatus();
  };
  JsonlRecord r;
  if (rec.contains("text")) {
    if (absl::Status st = field("text", &r.text); !st.ok()) return st;
    return r;
  }
  if (rec.contains("prompt") && rec.contains("completion")) {
    r.has_prompt = true;
    if (absl::Status st = field("prompt", &r.prompt); !st.ok()) return st;
    if (absl::Status st = field("completion", &r.text); !st.ok()) return st;
    return r;
  }
  std::vector<std::string> keys;
  for (const auto& [k, v] : rec.items()) keys.push_back(k);
  return absl::InvalidArgumentError(absl::StrCat("needs a string \"text\", or strings \"prompt\" and ",
                                                 "\"completion\" (it has: ", absl::StrJoin(keys, ", "), ")"));
}

}  // namespace rp::workers::text
