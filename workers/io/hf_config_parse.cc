// ParseHfConfig / ReadHfConfig: no LibTorch here (the config fuzzer builds this file alone).
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "workers/io/confined_fs.h"
#include "workers/io/hf_config.h"

namespace rp::workers::io {

absl::StatusOr<models::TransformerConfig> ParseHfConfig(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError("config.json: " + m); };
  auto get_int = [&](const char* key, int64_t* out, bool required) -> absl::Status {
    if (!j.contains(key) || j[key].is_null()) {
      return required ? bad(absl::StrCat("missing ", key)) : absl::OkStatus();
    }
    // Unsigned values above int64 and anything above 2^31 are refused here (never truncated).
    if (!j[key].is_number_integer() || (j[key].is_number_unsigned() && j[key].get<uint64_t>() > (uint64_t{1} << 31)) ||
        j[key].get<int64_t>() <= 0 || j[key].get<int64_t>() > (int64_t{1} << 31) - 1)
      return bad(absl::StrCat(key, " must be a positive integer below 2^31"));
    *out = j[key].get<int64_t>();
    return absl::OkStatus();
  };
  auto get_num = [&](const char* key, double* out) -> absl::Status {
    if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
    if (!j[key].is_number() || !(j[key].get<double>() > 0) || !std::isfinite(j[key].get<double>()))
      return bad(absl::StrCat(key, " must be a finite positive number"));
    *out = j[key].get<double>();
    return absl::OkStatus();
  };
  const std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  models::TransformerConfig c;
  if (type == "llama" || type == "mistral") {
    c.family = "llama";
  } else if (type == "qwen3") {
    c.family = "qwen3";
    c.qk_norm = true;
  } else if (type == "qwen2") {
    c.family = "llama";  // Qwen2 = Llama layout + q/k/v biases, checked below
  } else {
    return bad(absl::StrCat("model_type '", type, "' is not supported (llama, mistral, qwen2, qwen3)"));
  }
  int64_t blocks = 0, heads = 0, kv = 0;
  for (absl::Status st : {get_int("vocab_size", &c.vocab, true), get_int("hidden_size", &c.hidden, true),
                          get_int("intermediate_size", &c.intermediate, true),
                          get_int("num_hidden_layers", &blocks, true), get_int("num_attention_heads", &heads, true)}) {
    if (!st.ok()) return st;
  }
  kv = heads;
  if (absl::Status st = get_int("num_key_value_heads", &kv, false); !st.ok()) return st;
  c.num_blocks = static_cast<int>(blocks);
  c.num_heads = static_cast<int>(heads);
  c.num_kv_heads = static_cast<int>(kv);
  c.head_dim = c.hidden / heads;
  if (absl::Status st = get_int("head_dim", &c.head_dim, false); !st.ok()) return st;
  if (absl::Status st = get_num("rope_theta", &c.rope_theta); !st.ok()) return st;
  if (absl::Status st = get_num("rms_norm_eps", &c.rms_eps); !st.ok()) return st;
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()) {
    c.tied_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  const bool qwen2 = type == "qwen2";
  if (qwen2 || (j.contains("attention_bias") && j["attention_bias"].is_boolean() && j["attention_bias"].get<bool>())) {
    return bad("attention biases (Qwen2, attention_bias: true) are not supported by the engine's layers");
  }
  if (j.contains("mlp_bias") && j["mlp_bias"].is_boolean() && j["mlp_bias"].get<bool>()) {
    return bad("mlp_bias: true is not supported");
  }
  if (j.contains("hidden_act") && !(j["hidden_act"].is_string() && j["hidden_act"] == "silu"))
    return bad("hidden_act must be silu");
  if (type == "mistral" && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    return bad("sliding_window attention is not supported (set it to null for full attention)");
  }
  // RoPE: transformers >= 5 writes "rope_parameters" (with rope_theta inside); older configs
  // have "rope_scaling" and a top-level "rope_theta".
  const nlohmann::json* rope = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    rope = &j["rope_parameters"];
  } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    if (!j["rope_scaling"].is_object()) return bad("rope_scaling must be an object or null");
    rope = &j["rope_scaling"];
  }
  if (rope) {
    const auto& r = *rope;
    if (r.contains("rope_theta")) {
      if (!r["rope_theta"].is_number() || r["rope_theta"].get<double>() <= 0) return bad("rope_theta must be positive");
      c.rope_theta = r["rope_theta"].get<double>();
    }
    std::string rt = "default";
    for (const char* key : {"rope_type", "type"}) {
      if (r.contains(key) && r[key].is_string()) {
        rt = r[key].get<std::string>();
        break;
      }
    }
    if (rt == "llama3") {
      auto num = [&](const char* key, double def) {
        return r.contains(key) && r[key].is_number() ? r[key].get<double>() : def;
      };
      c.rope_scaling.factor = num("factor", 8.0);
      c.rope_scaling.low_freq_factor = num("low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = num("high_freq_factor", 4.0);
      c.rope_scaling.original_max_position = static_cast<int64_t>(num("original_max_position_embeddings", 8192));
      if (c.rope_scaling.factor <= 0 || c.rope_scaling.original_max_position <= 0)
        return bad("bad llama3 rope scaling");
    } else if (rt != "default") {
      return bad(absl::StrCat("rope type '", rt, "' is not supported (default or llama3)"));
    }
  }
  if (absl::Status st = c.Validate(); !st.ok()) return bad(std::string(st.message()));
  return c;
}

absl::StatusOr<models::TransformerConfig> ReadHfConfig(const std::string& dir) {
  // A regular file beneath the daemon's roots, at most 1 MiB (a FIFO or /dev/zero cannot hold a reader).
  auto text = ReadSmallFile((std::filesystem::path(dir) / "config.json").string(), uint64_t{1} << 20);
  if (!text.ok()) return text.status();
  return ParseHfConfig(*text);
}

}  // namespace rp::workers::io
