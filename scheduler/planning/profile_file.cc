#include "scheduler/planning/profile_file.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "workers/base/json_depth.h"

namespace rp::planning {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "roundpipe.profile.v1";

const char* KindName(LayerKind k) {
  switch (k) {
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kHead:
      return "head";
    case LayerKind::kBlock:
      break;
  }
  return "block";
}

// A non-negative finite number at `key` (required unless `fallback` is given).
absl::StatusOr<double> Seconds(const json& o, const char* key, const std::string& where, bool required) {
  if (!o.contains(key)) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("profile: ", where, " has no \"", key, "\""));
    return 0.0;
  }
  const json& v = o[key];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("profile: ", where, " \"", key, "\" must be a non-negative number"));
  }
  return v.get<double>();
}

absl::StatusOr<int64_t> Bytes(const json& o, const char* key, const std::string& where) {
  if (!o.contains(key)) return int64_t{0};
  const json& v = o[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile: ", where, " \"", key, "\" must be a non-negative integer"));
  }
  return v.get<int64_t>();
}

}  // namespace

absl::StatusOr<Profile> ParseProfile(absl::string_view text) {
  if (std::string deep = base::JsonDepthError(std::string_view(text.data(), text.size())); !deep.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("profile: ", deep));
  }
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("profile: not a JSON object");
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat("profile: \"format\" must be \"", kFormat, "\""));
  }
  Profile p;
  if (j.contains("name") && j["name"].is_string()) p.name = j["name"].get<std::string>();
  auto tokens = Bytes(j, "tokens_per_microbatch", "the file");
  if (!tokens.ok()) return tokens.status();
  auto boundary = Bytes(j, "boundary_bytes_per_token", "the file");
  if (!boundary.ok()) return boundary.status();
  p.costs.tokens_per_microbatch = *tokens;
  p.costs.boundary_bytes_per_token = *boundary;
  if (j.contains("activation_hop_s")) {
    auto hop = Seconds(j, "activation_hop_s", "the file", true);
    if (!hop.ok()) return hop.status();
    p.activation_hop_s = *hop;
  }
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].empty()) {
    return absl::InvalidArgumentError("profile: \"layers\" must be a non-empty array");
  }
  if (j["layers"].size() > 100000) return absl::InvalidArgumentError("profile: more than 100000 layers");
  for (size_t i = 0; i < j["layers"].size(); ++i) {
    const json& o = j["layers"][i];
    const std::string where = absl::StrCat("layer ", i);
    if (!o.is_object()) return absl::InvalidArgumentError(absl::StrCat("profile: ", where, " is not an object"));
    LayerCost c;
    const std::string kind = o.contains("kind") && o["kind"].is_string() ? o["kind"].get<std::string>() : "";
    if (kind == "embedding") {
      c.kind = LayerKind::kEmbedding;
    } else if (kind == "head") {
      c.kind = LayerKind::kHead;
    } else if (kind == "block" || kind.empty()) {
      c.kind = LayerKind::kBlock;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("profile: ", where, " \"kind\" must be embedding, block or head (got '", kind, "')"));
    }
    for (auto [key, out] : {std::pair{"forward_s", &c.fwd_s}, {"backward_s", &c.bwd_s}, {"fused_s", &c.fused_s}}) {
      auto v = Seconds(o, key, where, /*required=*/true);
      if (!v.ok()) return v.status();
      *out = *v;
    }
    for (auto [key, out] : {std::pair{"param_bytes", &c.param_bytes},
                            {"trainable_bytes", &c.trainable_bytes},
                            {"activation_bytes_per_token", &c.act_bytes_per_token},
                            {"fixed_work_bytes", &c.fixed_work_bytes}}) {
      auto v = Bytes(o, key, where);
      if (!v.ok()) return v.status();
      *out = *v;
    }
    p.costs.layers.push_back(c);
  }
  return p;
}

std::string ProfileJson(const Profile& p) {
  json layers = json::array();
  for (const LayerCost& c : p.costs.layers) {
    layers.push_back({{"kind", KindName(c.kind)},
                      {"forward_s", c.fwd_s},
                      {"backward_s", c.bwd_s},
                      {"fused_s", c.fused_s},
                      {"param_bytes", c.param_bytes},
                      {"trainable_bytes", c.trainable_bytes},
                      {"activation_bytes_per_token", c.act_bytes_per_token},
                      {"fixed_work_bytes", c.fixed_work_bytes}});
  }
  json j = {{"format", kFormat},
            {"name", p.name},
            {"tokens_per_microbatch", p.costs.tokens_per_microbatch},
            {"boundary_bytes_per_token", p.costs.boundary_bytes_per_token},
            {"layers", layers}};
  if (p.activation_hop_s >= 0) j["activation_hop_s"] = p.activation_hop_s;
  return j.dump(1) + "\n";
}

}  // namespace rp::planning
