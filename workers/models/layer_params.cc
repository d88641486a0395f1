// The parameter layout of a model and its layers (LayerParams, ModelParams) and its LoRA
// targets: names, shapes and roles in the order the stage functions take them (layers.h).
#include "workers/models/layers.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace rp::workers::models {

std::vector<ParamSpec> ModelParams(const spec::ModelConfig& cfg) {
  std::vector<ParamSpec> out;
  for (int l = 0; l < cfg.num_layers(); ++l) {
    for (ParamSpec& p : LayerParams(cfg, l)) {
      if (std::none_of(out.begin(), out.end(), [&](const ParamSpec& o) { return o.name == p.name; })) {
        out.push_back(std::move(p));
      }
    }
  }
  return out;
}

namespace {

// A block's attention weights, in the order BlockForward takes them.
void AttentionParams(const spec::ModelConfig& c, const std::string& p, std::vector<ParamSpec>* out) {
  const int64_t h = c.hidden, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  out->push_back({p + "input_layernorm.weight", {h}, true});
  const std::pair<const char*, std::vector<int64_t>> projections[] = {
      {"q_proj", {q, h}}, {"k_proj", {kv, h}}, {"v_proj", {kv, h}}, {"o_proj", {h, q}}};
  for (const auto& [name, shape] : projections) {
    out->push_back({p + "self_attn." + name + ".weight", shape});
    if (c.attention_bias) out->push_back({p + "self_attn." + name + ".bias", {shape[0]}});
  }
  if (c.qk_norm) {
    out->push_back({p + "self_attn.q_norm.weight", {c.head_dim}, true});
    out->push_back({p + "self_attn.k_norm.weight", {c.head_dim}, true});
  }
  if (c.gpt_oss()) out->push_back({p + "self_attn.sinks", {c.num_heads}});
  out->push_back({p + "post_attention_layernorm.weight", {h}, true});
}

// A block's MLP: dense, Qwen3-MoE's stacked experts (transformers >= 5's layout) or GPT-OSS's.
void MlpParams(const spec::ModelConfig& c, int block, const std::string& p, std::vector<ParamSpec>* out) {
  const int64_t h = c.hidden, e = c.num_experts, i = c.expert_intermediate;
  if (c.gpt_oss()) {
    out->push_back({p + "mlp.router.weight", {e, h}});
    out->push_back({p + "mlp.router.bias", {e}});
    out->push_back({p + "mlp.experts.gate_up_proj", {e, h, 2 * i}});
    out->push_back({p + "mlp.experts.gate_up_proj_bias", {e, 2 * i}});
    out->push_back({p + "mlp.experts.down_proj", {e, i, h}});
    out->push_back({p + "mlp.experts.down_proj_bias", {e, h}});
  } else if (c.SparseBlock(block)) {
    out->push_back({p + "mlp.gate.weight", {e, h}});
    out->push_back({p + "mlp.experts.gate_up_proj", {e, 2 * i, h}});
    out->push_back({p + "mlp.experts.down_proj", {e, h, i}});
  } else {
    out->push_back({p + "mlp.gate_proj.weight", {c.intermediate, h}});
    out->push_back({p + "mlp.up_proj.weight", {c.intermediate, h}});
    out->push_back({p + "mlp.down_proj.weight", {h, c.intermediate}});
  }
}

}  // namespace

std::vector<ParamSpec> LayerParams(const spec::ModelConfig& c, int layer) {
  const int64_t h = c.hidden;
  if (layer == 0) return {{"model.embed_tokens.weight", {c.vocab, h}}};
  if (layer == c.head_layer()) {
    return {{"model.norm.weight", {h}, true},
            {c.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", {c.vocab, h}}};
  }
  const std::string p = absl::StrCat("model.layers.", layer - 1, ".");
  std::vector<ParamSpec> out;
  AttentionParams(c, p, &out);
  MlpParams(c, layer - 1, p, &out);
  if (c.lora.rank > 0) {
    const int64_t r = c.lora.rank;
    for (const std::string& m : LoraModules()) {
      if (!c.lora.Targets(m)) continue;
      const bool mlp = m == "gate_proj" || m == "up_proj" || m == "down_proj";
      const std::string base = p + (mlp ? "mlp." : "self_attn.") + m;
      const auto& w =
          *std::find_if(out.begin(), out.end(), [&](const ParamSpec& ps) { return ps.name == base + ".weight"; });
      const int64_t out_f = w.shape[0], in_f = w.shape[1];
      out.push_back({base + ".lora_A.weight", {r, in_f}, false, 1});
      out.push_back({base + ".lora_B.weight", {out_f, r}, false, 2});
    }
    for (const ExpertLora& t : ExpertLoraTargets(c, layer - 1)) {
      out.push_back({t.a, {r * c.num_experts, t.in}, false, 1});
      out.push_back({t.b, {t.out, r * c.num_experts}, false, 2});
    }
  }
  return out;
}

std::vector<ExpertLora> ExpertLoraTargets(const spec::ModelConfig& c, int block) {
  std::vector<ExpertLora> out;
  if (c.lora.rank <= 0 || !c.SparseBlock(block)) return out;
  const bool gate_up = c.lora.Targets("experts.gate_up_proj"), down = c.lora.Targets("experts.down_proj");
  const std::string p = absl::StrCat("model.layers.", block, ".mlp.experts.");
  const int64_t h = c.hidden, i = c.expert_intermediate;
  if (gate_up) {
    const std::string stem = p + (down ? "base_layer." : "");
    out.push_back(
        {"experts.gate_up_proj", p + "gate_up_proj", stem + "lora_A.weight", stem + "lora_B.weight", h, 2 * i});
  }
  if (down) out.push_back({"experts.down_proj", p + "down_proj", p + "lora_A.weight", p + "lora_B.weight", i, h});
  return out;
}

at::Tensor ExpertLoraDelta(const spec::ModelConfig& c, const at::Tensor& a, const at::Tensor& b) {
  const int64_t e = c.num_experts, r = c.lora.rank;
  const at::Tensor a3 = a.view({e, r, a.size(1)});                     // [E, r, in]
  const at::Tensor b3 = b.view({b.size(0), r, e}).permute({2, 0, 1});  // [E, out, r]
  const at::Tensor delta = at::bmm(b3, a3) * (c.lora.alpha / r);       // [E, out, in]
  return c.gpt_oss() ? delta.transpose(1, 2).contiguous() : delta;
}

const std::vector<std::string>& LoraModules() {
  static const std::vector<std::string> kModules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};
  return kModules;
}

}  // namespace rp::workers::models
