#include "workers/files/bounded_json.h"

#include "absl/strings/str_cat.h"

namespace rp::files {

absl::StatusOr<nlohmann::json> ParseBoundedJson(std::string_view text, absl::string_view what, int max_depth) {
  if (std::string e = base::JsonDepthError(text, max_depth); !e.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", e));
  }
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(what, ": not valid JSON"));
  return j;
}

const nlohmann::json& MemberOrNull(const nlohmann::json& j, std::string_view key) {
  static const nlohmann::json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

}  // namespace rp::files
