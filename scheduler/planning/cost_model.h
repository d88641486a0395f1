// cost_model.h — per-layer costs that the partitioner and the simulator consume.
//
// Contract: value types and pure functions, plus MeasuredProfile, a small accumulator that is
// NOT thread-safe (the controller owns one per job and feeds it from one thread).
// Layer indices follow the engine: 0 = token embedding, 1..num_blocks = decoder blocks,
// num_blocks+1 = final norm + LM head + loss.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/planning/presets.h"

namespace rp::planning {

enum class LayerKind { kEmbedding, kBlock, kHead };

// Costs of one layer for ONE micro-batch.
struct LayerCost {
  LayerKind kind = LayerKind::kBlock;
  double fwd_s = 0;                 // forward, autograd off
  double bwd_s = 0;                 // backward incl. recompute of the forward (reload checkpoint)
  double fused_s = 0;               // forward with autograd + backward, no recompute (fused B_1 stage)
  int64_t param_bytes = 0;          // low-precision master copy uploaded to the device
  int64_t trainable_bytes = 0;      // gradient bytes downloaded (0 for frozen parameters)
  int64_t act_bytes_per_token = 0;  // activations autograd keeps during backward, per token
  int64_t fixed_work_bytes = 0;     // token-independent work buffers (e.g. loss chunk logits)
};

struct CostModel {
  std::vector<LayerCost> layers;
  int64_t tokens_per_microbatch = 0;     // for activation memory; 0 = ignore activations
  int64_t boundary_bytes_per_token = 0;  // stage-boundary activation (hidden * dtype bytes)

  int num_layers() const { return static_cast<int>(layers.size()); }
  // Device memory one layer needs inside a forward stage / a backward or fused stage.
  int64_t ForwardMemory(int layer) const;
  int64_t BackwardMemory(int layer) const;
};

struct AnalyticOptions {
  int64_t micro_batch_size = 4;  // sequences per micro-batch
  int64_t sequence_length = 2048;
  int dtype_bytes = 2;                 // bf16/fp16 compute and master copy
  int grad_bytes = 2;                  // device gradient buffer (compute dtype; fp32 lives on the host)
  double matmul_efficiency = 0.70;     // achieved / peak for large GEMMs
  double attention_efficiency = 0.45;  // fused causal attention kernels
  // Grouped expert GEMMs run at the matmul rate times rows / (rows + expert_half_rows), rows =
  // the tokens one expert receives (tokens x active / experts): small per-expert GEMMs are slow.
  double expert_half_rows = 1024;
  // Work per layer the other terms do not count (small kernels, casts, launches), as memory
  // traffic per token: once in a forward, backward_overhead_factor times in a backward
  // (240 KB: 1.95 ms per layer forward at 8192 tokens on an RTX 4090).
  double layer_overhead_bytes_per_token = 240e3;
  double backward_overhead_factor = 2.5;
  // Attention with sinks (GPT-OSS) runs a masked kernel over every key (no causal skipping), and
  // its backward makes this many fp32 passes over the score matrix (batch x heads x seq x seq).
  double sink_backward_score_passes = 8;
  int loss_chunk_tokens = 4096;  // head computes the loss in token chunks (no full logits)
};

// Analytic roofline-style costs: FLOPs over (peak x efficiency) plus memory-bound traffic over
// device bandwidth plus a per-layer overhead. Backward costs 2x the forward matmul FLOPs
// (1x with a frozen base under LoRA) and 2.5x for attention; bwd_s and fused_s both include one
// forward. The defaults are fitted to the authors' measured RTX 4090 layer times (the five
// profiles in tests/bench/profiles): every block and head time within 15 % (docs/SIMULATOR.md).
absl::StatusOr<CostModel> AnalyticCostModel(const spec::ModelConfig& model, const DeviceProfile& device,
                                            const AnalyticOptions& opt);

// A synthetic model of `num_layers` layers: uniform blocks with an embedding and a heavy head,
// for benchmarks and tests (time unit: seconds; ratios as on a 4090 for Llama-like layers).
CostModel SyntheticCostModel(int num_layers, double head_to_block_ratio);

// Measured per-layer times from real runs (paper §4.4): an exponential moving average per layer
// and kind (alpha, bias-corrected); the first `skip_first` samples of each are dropped (warm-up).
class MeasuredProfile {
 public:
  enum class Kind { kForward = 0, kBackward = 1, kFused = 2 };
  MeasuredProfile(int num_layers, double alpha = 0.9, int skip_first = 1);

  void Record(int layer, Kind kind, double seconds);
  // Number of samples that entered the average (after skipping) for one layer and kind.
  int Samples(int layer, Kind kind) const;
  // True when every layer has a forward and a backward estimate, or a fused one (the head).
  bool Complete() const;
  // `base` with every measured time replaced by its estimate. Missing fused estimates fall back
  // to the measured backward (and vice versa).
  CostModel Apply(const CostModel& base) const;

 private:
  struct Ema {
    double value = 0;
    double weight = 0;  // 1 - alpha^n, for bias correction
    int seen = 0;
    int used = 0;
  };
  std::optional<double> Estimate(int layer, Kind kind) const;
  const Ema& Get(int layer, Kind kind) const { return ema_[static_cast<size_t>(layer) * 3 + static_cast<int>(kind)]; }
  Ema& Get(int layer, Kind kind) { return ema_[static_cast<size_t>(layer) * 3 + static_cast<int>(kind)]; }

  int num_layers_;
  double alpha_;
  int skip_first_;
  std::vector<Ema> ema_;
};

}  // namespace rp::planning
