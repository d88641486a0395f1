// gpt_oss.h — the parts of a GPT-OSS decoder block that no other family has, as transformers'
// GptOssAttention (eager), GptOssTopKRouter and GptOssExperts compute them: attention whose
// softmax has one learned "sink" logit per head in its denominator, the biased router (top-k on
// the logits, softmax over the selected k), and experts with biases and the clamped SwiGLU.
// BlockForward (layers.h) assembles them; tests and benchmarks may call them alone.
//
// Contract: stateless and thread-safe; autograd is whatever the caller's GradMode says.
#pragma once

#include <ATen/core/Tensor.h>

#include "workers/models/layers.h"
#include "workers/spec/model_config.h"

namespace rp::workers::models {

// q, k, v [b, H, s, d] (k and v already repeated to H heads); sinks [H]; mask bool [s, s] or
// [b, 1, s, s], true = may attend. Scores q·kᵀ/√d, masked, and the head's sink logit share one
// softmax; the sink's share is dropped, so a row's weights sum to less than 1. -> [b, H, s, d].
// Runs as one scaled_dot_product_attention (the sink as an extra key with a zero value, the head
// width padded by 8), so the fused kernels apply and no [b, H, s, s] scores are kept.
at::Tensor SinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
                         const at::Tensor& mask);

// Routing of x [.., h] (T tokens) by logits = x·weightᵀ + bias: the top-k experts by logit and
// weights softmax(top-k logits) (in the logits' dtype). With `replay` the experts (and counts)
// are replay's and the weights the softmax of the logits gathered at them. `probs` (the fp32
// softmax over all experts, the auxiliary loss's input) is set only when the model has an aux loss.
MoeRouting GptOssRoute(const spec::ModelConfig& cfg, const at::Tensor& weight, const at::Tensor& bias,
                       const at::Tensor& x, const RoutingDecision* replay = nullptr);

// A GPT-OSS block's expert tensors (the hub's and transformers' layout).
struct GptOssExpertWeights {
  at::Tensor gate_up;       // [E, h, 2I], gate and up columns interleaved (gate even, up odd)
  at::Tensor gate_up_bias;  // [E, 2I]
  at::Tensor down;          // [E, I, h]
  at::Tensor down_bias;     // [E, h]
};
// The experts' output for x [.., h] under `routing`, grouped by expert as MoeExperts:
// per expert (clamp(up, ±limit) + 1) · g·sigmoid(alpha·g), g = min(gate, limit), times down.
// `lora` adds each expert's adapters (layers.h ExpertLoraTargets).
at::Tensor GptOssExperts(const spec::ModelConfig& cfg, const GptOssExpertWeights& w, const at::Tensor& x,
                         const MoeRouting& routing, const ExpertAdapters& lora = {});

}  // namespace rp::workers::models
