// ParsePeftConfig / ReadPeftConfig: a PEFT adapter_config.json as a spec::LoraSpec, and its base
// model's name. No LibTorch here (the adapter config fuzzer builds this file alone).
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "workers/files/bounded_json.h"
#include "workers/files/confined_fs.h"
#include "workers/files/hf_configs.h"

namespace rp::files {

absl::StatusOr<spec::LoraSpec> ParsePeftConfig(const std::string& text) {
  auto parsed = ParseBoundedJson(text, "adapter_config.json");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) return absl::InvalidArgumentError("adapter_config.json: not a JSON object");
  if (!(j.contains("peft_type") && j["peft_type"].is_string() && j["peft_type"] == "LORA"))
    return absl::InvalidArgumentError("adapter_config.json: not LORA");
  spec::LoraSpec c;
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1 || j["r"].get<int64_t>() > 65536) {
    return absl::InvalidArgumentError("adapter_config.json: r must be an integer in [1, 65536]");
  }
  c.rank = j["r"].get<int>();
  c.alpha = j.contains("lora_alpha") && j["lora_alpha"].is_number() ? j["lora_alpha"].get<double>() : 8.0;
  if (!j.contains("target_modules") || !j["target_modules"].is_array()) {
    return absl::InvalidArgumentError("adapter_config.json: target_modules must be a list");
  }
  c.targets.clear();  // the file's list replaces the default attention projections
  for (const auto& t : j["target_modules"]) {
    if (!t.is_string()) return absl::InvalidArgumentError("adapter_config.json: target_modules must be strings");
    c.targets.push_back(t.get<std::string>());
  }
  // PEFT's target_parameters: the stacked experts, named by any suffix ending in
  // experts.gate_up_proj / experts.down_proj.
  if (j.contains("target_parameters") && !j["target_parameters"].is_null()) {
    if (!j["target_parameters"].is_array()) {
      return absl::InvalidArgumentError("adapter_config.json: target_parameters must be a list");
    }
    for (const auto& t : j["target_parameters"]) {
      const std::string name = t.is_string() ? t.get<std::string>() : "";
      const std::string which = absl::EndsWith(name, "experts.gate_up_proj") ? "experts.gate_up_proj"
                                : absl::EndsWith(name, "experts.down_proj")  ? "experts.down_proj"
                                                                             : "";
      if (which.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("adapter_config.json: target_parameters entry '", name,
                                                       "' is not supported (experts.gate_up_proj, experts.down_proj)"));
      }
      c.targets.push_back(which);
    }
  }
  auto flag = [&](const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); };
  if (flag("use_dora") || flag("use_rslora")) {
    return absl::InvalidArgumentError("adapter_config.json: DoRA / rsLoRA are not supported");
  }
  return c;
}

absl::StatusOr<std::string> ParsePeftBaseModel(const std::string& text) {
  auto parsed = ParseBoundedJson(text, "adapter_config.json");
  if (!parsed.ok()) return parsed.status();
  if (!parsed->is_object()) return absl::InvalidArgumentError("adapter_config.json: not a JSON object");
  const nlohmann::json& b = MemberOrNull(*parsed, "base_model_name_or_path");
  if (b.is_null()) return std::string();
  if (!b.is_string())
    return absl::InvalidArgumentError("adapter_config.json: base_model_name_or_path must be a string");
  return b.get<std::string>();
}

namespace {

// The last non-empty component of a hub id or a path, lower-cased.
std::string LastName(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  const size_t slash = s.rfind('/');
  return absl::AsciiStrToLower(slash == std::string::npos ? s : s.substr(slash + 1));
}

}  // namespace

bool SameBaseModel(const std::string& adapter_base, const std::string& hf_dir) {
  if (adapter_base.empty() || hf_dir.empty()) return true;
  if (LastName(adapter_base) == LastName(hf_dir)) return true;
  std::error_code ec1, ec2;
  const auto a = std::filesystem::weakly_canonical(adapter_base, ec1);
  const auto h = std::filesystem::weakly_canonical(hf_dir, ec2);
  return !ec1 && !ec2 && a == h;
}

namespace {
// adapter_config.json of an adapter directory: a regular file beneath the daemon's roots, at
// most 64 MiB.
absl::StatusOr<std::string> ReadAdapterConfig(const std::string& dir) {
  return ReadSmallFile((std::filesystem::path(dir) / "adapter_config.json").string(), uint64_t{64} << 20);
}
}  // namespace

absl::StatusOr<spec::LoraSpec> ReadPeftConfig(const std::string& dir) {
  auto text = ReadAdapterConfig(dir);
  if (!text.ok()) return text.status();
  return ParsePeftConfig(*text);
}

absl::StatusOr<std::string> ReadPeftBaseModel(const std::string& dir) {
  auto text = ReadAdapterConfig(dir);
  if (!text.ok()) return text.status();
  return ParsePeftBaseModel(*text);
}

}  // namespace rp::files
