// ParseHfConfig / ReadHfConfig: no LibTorch here (the config fuzzer builds this file alone).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "workers/base/json_depth.h"
#include "workers/files/confined_fs.h"
#include "workers/files/hf_configs.h"

namespace rp::files {

namespace {

using Json = nlohmann::json;

absl::Status Bad(const std::string& m) { return absl::InvalidArgumentError("config.json: " + m); }

// A positive integer below 2^31 (absent: `out` unchanged, an error only if `required`).
absl::Status GetInt(const Json& j, const char* key, int64_t* out, bool required) {
  if (!j.contains(key) || j[key].is_null()) return required ? Bad(absl::StrCat("missing ", key)) : absl::OkStatus();
  // Unsigned values above int64 and anything above 2^31 are refused here (never truncated).
  if (!j[key].is_number_integer() || (j[key].is_number_unsigned() && j[key].get<uint64_t>() > (uint64_t{1} << 31)) ||
      j[key].get<int64_t>() <= 0 || j[key].get<int64_t>() > (int64_t{1} << 31) - 1)
    return Bad(absl::StrCat(key, " must be a positive integer below 2^31"));
  *out = j[key].get<int64_t>();
  return absl::OkStatus();
}

// A finite positive number (absent: `out` unchanged).
absl::Status GetNum(const Json& j, const char* key, double* out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  if (!j[key].is_number() || !(j[key].get<double>() > 0) || !std::isfinite(j[key].get<double>()))
    return Bad(absl::StrCat(key, " must be a finite positive number"));
  *out = j[key].get<double>();
  return absl::OkStatus();
}

bool IsTrue(const Json& j, const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }

absl::Status ParseFamily(const std::string& type, spec::ModelConfig* c) {
  if (type == "llama" || type == "mistral") {
    c->family = "llama";
  } else if (type == "qwen3" || type == "qwen3_moe") {
    c->family = "qwen3";
    c->qk_norm = true;
  } else if (type == "qwen2") {
    c->family = "llama";  // Qwen2 = Llama layout + q/k/v biases, refused by CheckSupportedLayers
  } else if (type == "gpt_oss") {
    c->family = "gpt_oss";
    c->rope_theta = 150000;  // GptOssConfig.default_theta
    c->rms_eps = 1e-5;
  } else {
    return Bad(
        absl::StrCat("model_type '", type, "' is not supported (llama, mistral, qwen2, qwen3, qwen3_moe, gpt_oss)"));
  }
  return absl::OkStatus();
}

// Sizes, heads, norms and the tied head.
absl::Status ParseShape(const Json& j, spec::ModelConfig* c) {
  int64_t blocks = 0, heads = 0, kv = 0;
  for (absl::Status st :
       {GetInt(j, "vocab_size", &c->vocab, true), GetInt(j, "hidden_size", &c->hidden, true),
        GetInt(j, "intermediate_size", &c->intermediate, true), GetInt(j, "num_hidden_layers", &blocks, true),
        GetInt(j, "num_attention_heads", &heads, true)}) {
    if (!st.ok()) return st;
  }
  kv = heads;
  if (absl::Status st = GetInt(j, "num_key_value_heads", &kv, false); !st.ok()) return st;
  c->num_blocks = static_cast<int>(blocks);
  c->num_heads = static_cast<int>(heads);
  c->num_kv_heads = static_cast<int>(kv);
  c->head_dim = c->hidden / heads;
  if (absl::Status st = GetInt(j, "head_dim", &c->head_dim, false); !st.ok()) return st;
  if (absl::Status st = GetNum(j, "rope_theta", &c->rope_theta); !st.ok()) return st;
  if (absl::Status st = GetNum(j, "rms_norm_eps", &c->rms_eps); !st.ok()) return st;
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()) {
    c->tied_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  return absl::OkStatus();
}

// Qwen3-MoE's experts (transformers' Qwen3MoeConfig: norm_topk_prob defaults to false,
// decoder_sparse_step to 1, mlp_only_layers to none).
absl::Status ParseExperts(const Json& j, spec::ModelConfig* c) {
  int64_t experts = 0, top_k = 0, width = c->intermediate, step = 1;
  const char* experts_key =
      j.contains("num_local_experts") && !j.contains("num_experts") ? "num_local_experts" : "num_experts";
  // GPT-OSS: every block sparse, the experts intermediate_size wide.
  const bool gpt_oss = c->gpt_oss();
  for (absl::Status st :
       {GetInt(j, experts_key, &experts, true), GetInt(j, "num_experts_per_tok", &top_k, true),
        GetInt(j, "moe_intermediate_size", &width, !gpt_oss), GetInt(j, "decoder_sparse_step", &step, false)}) {
    if (!st.ok()) return st;
  }
  if (top_k > experts) {
    return Bad(absl::StrCat("num_experts_per_tok ", top_k, " is above ", experts_key, " ", experts));
  }
  c->num_experts = static_cast<int>(std::min<int64_t>(experts, 1 << 30));
  c->experts_per_token = static_cast<int>(top_k);
  c->expert_intermediate = width;
  c->decoder_sparse_step = static_cast<int>(step);
  c->norm_topk_prob = IsTrue(j, "norm_topk_prob") || gpt_oss;  // GPT-OSS: a softmax over the k selected
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    if (!j["mlp_only_layers"].is_array()) return Bad("mlp_only_layers must be a list of layer indices");
    for (const Json& x : j["mlp_only_layers"]) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c->num_blocks) {
        return Bad(absl::StrCat("mlp_only_layers: every entry must be a layer index in 0..", c->num_blocks - 1));
      }
      c->mlp_only_layers.push_back(static_cast<int>(x.get<int64_t>()));
    }
  }
  if (IsTrue(j, "output_router_logits")) {  // transformers then adds the load-balancing loss
    c->router_aux_loss_coef = 0.001;        // Qwen3MoeConfig's and GptOssConfig's default
    const char* key = "router_aux_loss_coef";
    if (j.contains(key) && !j[key].is_null()) {  // 0 is allowed here: transformers adds nothing
      if (!j[key].is_number() || !(j[key].get<double>() >= 0) || !std::isfinite(j[key].get<double>())) {
        return Bad("router_aux_loss_coef must be a finite number >= 0");
      }
      c->router_aux_loss_coef = j[key].get<double>();
    }
  }
  return absl::OkStatus();
}

// GPT-OSS's attention: q/k/v/o biases unless attention_bias is false, the sliding window and
// which blocks use it (layer_types; transformers' default alternates, sliding first), and the
// experts' clamped SwiGLU.
absl::Status ParseGptOss(const Json& j, spec::ModelConfig* c) {
  c->attention_bias =
      !(j.contains("attention_bias") && j["attention_bias"].is_boolean()) || j["attention_bias"].get<bool>();
  if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    if (absl::Status st = GetInt(j, "sliding_window", &c->sliding_window, false); !st.ok()) return st;
  } else {
    c->sliding_window = 128;  // GptOssConfig's default
  }
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const Json& types = j["layer_types"];
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c->num_blocks) {
      return Bad(absl::StrCat("layer_types must list ", c->num_blocks, " entries (num_hidden_layers)"));
    }
    for (int i = 0; i < c->num_blocks; ++i) {
      const Json& t = types[static_cast<size_t>(i)];
      if (t == "sliding_attention") {
        c->sliding_layers.push_back(i);
      } else if (t != "full_attention") {
        return Bad(absl::StrCat("layer_types[", i, "] must be sliding_attention or full_attention"));
      }
    }
  } else {
    for (int i = 0; i < c->num_blocks; i += 2) c->sliding_layers.push_back(i);
  }
  if (c->sliding_layers.empty()) c->sliding_window = 0;
  for (absl::Status st : {GetNum(j, "swiglu_alpha", &c->swiglu_alpha), GetNum(j, "swiglu_limit", &c->swiglu_limit)}) {
    if (!st.ok()) return st;
  }
  if (j.contains("attention_dropout") && !(j["attention_dropout"].is_number() && j["attention_dropout"] == 0)) {
    return Bad("attention_dropout must be 0");
  }
  return absl::OkStatus();
}

// What the engine's layers do not implement is refused, never silently ignored.
absl::Status CheckSupportedLayers(const Json& j, const std::string& type) {
  if (type == "gpt_oss") return absl::OkStatus();  // ParseGptOss reads its biases and windows
  if (type == "qwen2" || IsTrue(j, "attention_bias")) {
    return Bad("attention biases (Qwen2, attention_bias: true) are not supported by the engine's layers");
  }
  if (IsTrue(j, "mlp_bias")) return Bad("mlp_bias: true is not supported");
  if (j.contains("hidden_act") && !(j["hidden_act"].is_string() && j["hidden_act"] == "silu"))
    return Bad("hidden_act must be silu");
  if (type == "mistral" && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    return Bad("sliding_window attention is not supported (set it to null for full attention)");
  }
  return absl::OkStatus();
}

// YaRN as transformers' _compute_yarn_parameters reads it.
absl::Status ParseYarn(const Json& r, spec::ModelConfig* c) {
  auto num = [&](const char* key, double def) {
    return r.contains(key) && r[key].is_number() ? r[key].get<double>() : def;
  };
  spec::RopeScaling& y = c->rope_scaling;
  y.yarn = true;
  if (!r.contains("factor") || !r["factor"].is_number() || !r.contains("original_max_position_embeddings") ||
      !r["original_max_position_embeddings"].is_number_integer()) {
    return Bad("yarn rope scaling needs a number factor and an integer original_max_position_embeddings");
  }
  y.factor = r["factor"].get<double>();
  y.original_max_position = r["original_max_position_embeddings"].get<int64_t>();
  y.beta_fast = num("beta_fast", 0) != 0 ? num("beta_fast", 0) : 32;  // transformers: `or 32`
  y.beta_slow = num("beta_slow", 0) != 0 ? num("beta_slow", 0) : 1;
  y.truncate = !(r.contains("truncate") && r["truncate"].is_boolean()) || r["truncate"].get<bool>();
  if (!(y.factor > 0) || !std::isfinite(y.factor)) return Bad("yarn rope scaling: factor must be a finite number > 0");
  auto mscale = [&](double m) { return y.factor <= 1 ? 1.0 : 0.1 * m * std::log(y.factor) + 1.0; };
  if (r.contains("attention_factor") && !r["attention_factor"].is_null()) {
    y.attention_factor = num("attention_factor", 0);
  } else if (num("mscale", 0) != 0 && num("mscale_all_dim", 0) != 0) {
    y.attention_factor = mscale(num("mscale", 0)) / mscale(num("mscale_all_dim", 0));
  } else {
    y.attention_factor = mscale(1);
  }
  return absl::OkStatus();
}

// RoPE: transformers >= 5 writes "rope_parameters" (with rope_theta inside); older configs
// have "rope_scaling" and a top-level "rope_theta". GPT-OSS without either is YaRN with
// GptOssConfig's defaults.
absl::Status ParseRope(const Json& j, spec::ModelConfig* c) {
  const Json* rope = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    rope = &j["rope_parameters"];
  } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    if (!j["rope_scaling"].is_object()) return Bad("rope_scaling must be an object or null");
    rope = &j["rope_scaling"];
  }
  if (!rope && c->gpt_oss()) {
    static const Json kGptOssDefault = {{"rope_type", "yarn"}, {"factor", 32.0},
                                        {"beta_fast", 32.0},   {"beta_slow", 1.0},
                                        {"truncate", false},   {"original_max_position_embeddings", 4096}};
    rope = &kGptOssDefault;
  }
  if (!rope) return absl::OkStatus();
  const auto& r = *rope;
  if (r.contains("rope_theta")) {
    if (!r["rope_theta"].is_number() || r["rope_theta"].get<double>() <= 0) return Bad("rope_theta must be positive");
    c->rope_theta = r["rope_theta"].get<double>();
  }
  std::string rt = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (r.contains(key) && r[key].is_string()) {
      rt = r[key].get<std::string>();
      break;
    }
  }
  if (rt == "default") return absl::OkStatus();
  if (rt == "yarn") return ParseYarn(r, c);
  if (rt != "llama3") return Bad(absl::StrCat("rope type '", rt, "' is not supported (default, llama3 or yarn)"));
  auto num = [&](const char* key, double def) {
    return r.contains(key) && r[key].is_number() ? r[key].get<double>() : def;
  };
  c->rope_scaling.factor = num("factor", 8.0);
  c->rope_scaling.low_freq_factor = num("low_freq_factor", 1.0);
  c->rope_scaling.high_freq_factor = num("high_freq_factor", 4.0);
  c->rope_scaling.original_max_position = static_cast<int64_t>(num("original_max_position_embeddings", 8192));
  if (c->rope_scaling.factor <= 0 || c->rope_scaling.original_max_position <= 0) return Bad("bad llama3 rope scaling");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<spec::ModelConfig> ParseHfConfig(const std::string& text) {
  if (std::string deep = base::JsonDepthError(text); !deep.empty()) return Bad(deep);
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  const Json& cj = j;  // read only from here: operator[] on a const object never inserts
  const std::string type =
      cj.contains("model_type") && cj["model_type"].is_string() ? cj["model_type"].get<std::string>() : "";
  spec::ModelConfig c;
  if (absl::Status st = ParseFamily(type, &c); !st.ok()) return st;
  if (absl::Status st = ParseShape(cj, &c); !st.ok()) return st;
  if (absl::Status st = CheckSupportedLayers(cj, type); !st.ok()) return st;
  if (type == "qwen3_moe" || type == "gpt_oss") {
    if (absl::Status st = ParseExperts(cj, &c); !st.ok()) return st;
  }
  if (type == "gpt_oss") {
    if (absl::Status st = ParseGptOss(cj, &c); !st.ok()) return st;
  }
  if (cj.contains("quantization_config") && !cj["quantization_config"].is_null()) {
    const Json& q = cj["quantization_config"];
    const std::string method = q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()
                                   ? q["quant_method"].get<std::string>()
                                   : "";
    if (type != "gpt_oss" || method != "mxfp4") {
      return Bad(absl::StrCat("quantization_config: quant_method '", method,
                              "' is not supported (only GPT-OSS's mxfp4 experts, dequantised at load)"));
    }
  }
  if (absl::Status st = ParseRope(cj, &c); !st.ok()) return st;
  if (absl::Status st = c.Validate(); !st.ok()) return Bad(std::string(st.message()));
  return c;
}

absl::StatusOr<spec::ModelConfig> ReadHfConfig(const std::string& dir) {
  // A regular file beneath the daemon's roots, at most 1 MiB (a FIFO or /dev/zero cannot hold a reader).
  auto text = ReadSmallFile((std::filesystem::path(dir) / "config.json").string(), uint64_t{1} << 20);
  if (!text.ok()) return text.status();
  return ParseHfConfig(*text);
}

}  // namespace rp::files
