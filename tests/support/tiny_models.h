// tiny_models.h — the small model shapes the engine tests share: a 4-block Llama with grouped
// KV heads and Llama-3 rope scaling whose bands matter at short lengths, and a 3-block Qwen3 with
// q/k norms and tied embeddings. Header-only test support.
#pragma once

#include "workers/spec/model_config.h"

namespace rp::testing {

inline spec::ModelConfig TinyLlama() {
  spec::ModelConfig c;
  c.family = "llama";
  c.vocab = 61;
  c.hidden = 32;
  c.intermediate = 48;
  c.num_blocks = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.rope_theta = 500000;
  c.rms_eps = 1e-5;
  c.rope_scaling.factor = 8;
  c.rope_scaling.original_max_position = 4;  // short, so the scaling bands matter at length 8
  return c;
}

inline spec::ModelConfig TinyQwen3() {
  spec::ModelConfig c;
  c.family = "qwen3";
  c.vocab = 53;
  c.hidden = 24;
  c.intermediate = 40;
  c.num_blocks = 3;
  c.num_heads = 3;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.rope_theta = 1000000;
  c.qk_norm = true;
  c.tied_embeddings = true;
  return c;
}

}  // namespace rp::testing
