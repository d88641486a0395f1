#include "workers/io/hf_export.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "workers/files/atomic_dir.h"
#include "workers/files/hub_experts.h"
#include "workers/io/safetensors_writer.h"
#include "workers/models/layers.h"

namespace rp::workers::io {
namespace fs = std::filesystem;

namespace {
// Errors from the directory writer, prefixed once.
absl::Status Export(const absl::Status& st) { return absl::Status(st.code(), absl::StrCat("export: ", st.message())); }
}  // namespace

namespace {

// The architecture and its experts, as transformers' config classes name them.
void ArchitectureJson(const spec::ModelConfig& c, nlohmann::json& j) {
  const bool qwen = c.family == "qwen3";
  if (c.gpt_oss()) {
    j["architectures"] = {"GptOssForCausalLM"};
    j["model_type"] = "gpt_oss";
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.experts_per_token;
    j["swiglu_alpha"] = c.swiglu_alpha;
    j["swiglu_limit"] = c.swiglu_limit;
    j["output_router_logits"] = false;
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    nlohmann::json types = nlohmann::json::array();
    for (int b = 0; b < c.num_blocks; ++b) types.push_back(c.SlidingBlock(b) ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
    j["attention_bias"] = c.attention_bias;
    j["attention_dropout"] = 0.0;
    return;
  }
  j["architectures"] = {c.is_moe() ? "Qwen3MoeForCausalLM" : qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = c.is_moe() ? "qwen3_moe" : qwen ? "qwen3" : "llama";
  if (c.is_moe()) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.experts_per_token;
    j["moe_intermediate_size"] = c.expert_intermediate;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["output_router_logits"] = false;
  }
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
}

void RopeJson(const spec::ModelConfig& c, nlohmann::json& j) {
  const spec::RopeScaling& r = c.rope_scaling;
  j["rope_theta"] = c.rope_theta;
  j["max_position_embeddings"] = std::max<int64_t>(r.original_max_position, 8192);
  if (r.factor > 0 && r.yarn) {
    j["max_position_embeddings"] =
        static_cast<int64_t>(std::llround(static_cast<double>(r.original_max_position) * r.factor));
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", r.factor},
                         {"beta_fast", r.beta_fast},
                         {"beta_slow", r.beta_slow},
                         {"truncate", r.truncate},
                         {"attention_factor", r.attention_factor},
                         {"original_max_position_embeddings", r.original_max_position}};
  } else if (r.factor > 0) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position}};
  } else if (c.gpt_oss()) {  // GptOssConfig reads a missing rope_parameters as YaRN
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  } else {
    j["rope_scaling"] = nullptr;
  }
}

}  // namespace

std::string HfConfigJson(const spec::ModelConfig& c, at::ScalarType dtype) {
  nlohmann::json j;
  ArchitectureJson(c, j);
  j["vocab_size"] = c.vocab;
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.gpt_oss() ? c.expert_intermediate : c.intermediate;
  j["num_hidden_layers"] = c.num_blocks;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_eps;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = dtype == at::kFloat ? "float32" : dtype == at::kHalf ? "float16" : "bfloat16";
  RopeJson(c, j);
  return j.dump(2);
}

absl::StatusOr<int64_t> ExportHfModel(const std::string& dir_in, const spec::ModelConfig& config,
                                      const std::vector<NamedShape>& tensors,
                                      const std::function<absl::StatusOr<at::Tensor>(const std::string&)>& fetch,
                                      const HfExportOptions& options) {
  auto out = files::AtomicDir::Begin(fs::absolute(dir_in).string());
  if (!out.ok()) return Export(out.status());
  // The hub's layout: a Qwen3-MoE block's stacked experts go out per expert (hub_experts.h),
  // which every transformers version loads; GPT-OSS's go out stacked, as the hub stores them.
  struct Source {
    std::string name;  // the parameter
    files::HubExpertPiece piece;
    bool sliced = false;
  };
  std::vector<TensorDecl> decls;
  std::vector<Source> sources;
  for (const auto& [name, shape] : tensors) {
    const std::vector<files::HubExpertPiece> pieces =
        config.gpt_oss() ? std::vector<files::HubExpertPiece>{} : files::HubExpertPieces(name, shape);
    if (pieces.empty()) {
      decls.push_back({name, options.dtype, shape});
      sources.push_back({name, {}, false});
    }
    for (const files::HubExpertPiece& p : pieces) {
      decls.push_back({p.name, options.dtype, p.shape});
      sources.push_back({name, p, true});
    }
  }
  // One fetch per parameter: the stacked experts are sliced from the last one fetched.
  std::string cached_name;
  at::Tensor cached;
  auto fetch_decl = [&](size_t i) -> absl::StatusOr<at::Tensor> {
    const Source& s = sources[i];
    if (!s.sliced) return fetch(s.name);
    if (cached_name != s.name) {
      auto t = fetch(s.name);
      if (!t.ok()) return t.status();
      cached = *std::move(t);
      cached_name = s.name;
    }
    return cached.select(0, s.piece.expert).narrow(0, s.piece.row0, s.piece.rows).contiguous();
  };
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < decls.size(); ++i) {
    const int64_t b = NumBytes(decls[i]);
    if (in_shard > 0 && in_shard + b > options.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
  }
  int64_t total = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1
                                 ? std::string("model.safetensors")
                                 : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    std::vector<TensorDecl> part;
    for (size_t i : shards[s]) {
      part.push_back(decls[i]);
      weight_map[decls[i].name] = file;
      total += NumBytes(decls[i]);
    }
    SafetensorsWriter w;
    if (absl::Status st = w.Open(out->PathOf(file), part, {{"format", "pt"}}); !st.ok()) return Export(st);
    for (size_t i : shards[s]) {
      auto t = fetch_decl(i);
      if (!t.ok()) return t.status();
      if (absl::Status st = w.Add(*t); !st.ok()) return Export(st);
    }
    if (absl::Status st = w.Finish(); !st.ok()) return Export(st);
  }
  if (shards.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    if (absl::Status st = out->WriteFile("model.safetensors.index.json", index.dump(2)); !st.ok()) return Export(st);
  }
  if (absl::Status st = out->WriteFile("config.json", HfConfigJson(config, options.dtype)); !st.ok()) {
    return Export(st);
  }
  if (absl::Status st = out->Commit(); !st.ok()) return Export(st);
  return total;
}

absl::StatusOr<int64_t> ExportPeftAdapter(const std::string& dir_in, const spec::ModelConfig& config,
                                          const std::vector<NamedShape>& tensors,
                                          const std::function<absl::StatusOr<at::Tensor>(const std::string&)>& fetch) {
  if (config.lora.rank <= 0) return absl::FailedPreconditionError("export: the model has no LoRA adapters");
  auto out = files::AtomicDir::Begin(fs::absolute(dir_in).string());
  if (!out.ok()) return Export(out.status());
  auto fail = [](absl::Status st) { return Export(std::move(st)); };
  std::vector<TensorDecl> decls;
  int64_t total = 0;
  for (const auto& [name, shape] : tensors) {
    if (name.find(".lora_") == std::string::npos) continue;
    decls.push_back({"base_model.model." + name, at::kFloat, shape});
    total += NumBytes(decls.back());
  }
  SafetensorsWriter w;
  if (absl::Status st = w.Open(out->PathOf("adapter_model.safetensors"), decls, {{"format", "pt"}}); !st.ok()) {
    return fail(st);
  }
  for (const TensorDecl& d : decls) {
    auto t = fetch(d.name.substr(std::string("base_model.model.").size()));
    if (!t.ok()) return fail(t.status());
    if (absl::Status st = w.Add(*t); !st.ok()) return fail(st);
  }
  if (absl::Status st = w.Finish(); !st.ok()) return fail(st);
  // Modules go to target_modules; the stacked experts (experts.*) to target_parameters.
  std::vector<std::string> modules, parameters;
  for (const std::string& t : config.lora.targets) {
    if (t.rfind("experts.", 0) == 0) {
      parameters.push_back("mlp." + t);
    } else {
      modules.push_back(t);
    }
  }
  nlohmann::json j = {{"peft_type", "LORA"},    {"task_type", "CAUSAL_LM"},
                      {"r", config.lora.rank},  {"lora_alpha", config.lora.alpha},
                      {"lora_dropout", 0.0},    {"target_modules", modules},
                      {"bias", "none"},         {"fan_in_fan_out", false},
                      {"inference_mode", true}, {"base_model_name_or_path", nullptr}};
  if (!parameters.empty()) j["target_parameters"] = parameters;
  if (absl::Status st = out->WriteFile("adapter_config.json", j.dump(2)); !st.ok()) return fail(st);
  if (absl::Status st = out->Commit(); !st.ok()) return fail(st);
  return total;
}

absl::StatusOr<int64_t> ExportMergedLora(const std::string& dir, const spec::ModelConfig& config,
                                         const std::vector<NamedShape>& tensors,
                                         const std::function<absl::StatusOr<at::Tensor>(const std::string&)>& fetch,
                                         const HfExportOptions& options) {
  if (config.lora.rank <= 0) return absl::FailedPreconditionError("export: the model has no LoRA adapters");
  std::vector<NamedShape> base;
  for (const auto& t : tensors) {
    if (t.first.find(".lora_") == std::string::npos) base.push_back(t);
  }
  spec::ModelConfig plain = config;
  plain.lora = {};
  const double scale = config.lora.alpha / config.lora.rank;
  std::map<std::string, models::ExpertLora> experts;  // stacked experts with adapters, by name
  for (int b = 0; b < config.num_blocks; ++b) {
    for (const models::ExpertLora& t : models::ExpertLoraTargets(config, b)) experts[t.base] = t;
  }
  auto merged = [&](const std::string& name) -> absl::StatusOr<at::Tensor> {
    auto w = fetch(name);
    if (!w.ok()) return w;
    if (auto it = experts.find(name); it != experts.end()) {
      auto a = fetch(it->second.a);
      auto b = fetch(it->second.b);
      if (!a.ok()) return a;
      if (!b.ok()) return b;
      return *w + models::ExpertLoraDelta(config, *a, *b);
    }
    const std::string stem = name.substr(0, name.size() - std::string(".weight").size());
    const bool has = std::any_of(tensors.begin(), tensors.end(),
                                 [&](const NamedShape& t) { return t.first == stem + ".lora_A.weight"; });
    if (!has) return w;
    auto a = fetch(stem + ".lora_A.weight");
    auto b = fetch(stem + ".lora_B.weight");
    if (!a.ok()) return a;
    if (!b.ok()) return b;
    return *w + at::matmul(*b, *a) * scale;
  };
  return ExportHfModel(dir, plain, base, merged, options);
}

}  // namespace rp::workers::io
