// hub_experts.h — how a sparse block's stacked expert tensors lie in the Hugging Face hub's files.
// transformers >= 5 holds a Qwen3-MoE block's experts stacked (mlp.experts.gate_up_proj
// [E, 2I, h] with the gate rows first, mlp.experts.down_proj [E, h, I]); checkpoints on the hub
// (and save_pretrained) store one tensor per expert and projection
// (mlp.experts.N.gate_proj.weight [I, h], ...up_proj.weight [I, h], ...down_proj.weight [h, I]).
// The loader stacks those pieces, the exporter cuts them out again: both from this one list.
//
// Contract: pure and header-only (no LibTorch); any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace rp::files {

struct HubExpertPiece {
  std::string name;            // the hub's tensor
  int64_t expert = 0;          // its slice of the stacked tensor's first dimension
  int64_t row0 = 0, rows = 0;  // and rows [row0, row0 + rows) of that slice
  std::vector<int64_t> shape;  // {rows, columns}
};

// The pieces of the stacked tensor `name` of `shape`, expert by expert and in row order; empty
// when it is not a stacked expert tensor (then it is stored as it is).
inline std::vector<HubExpertPiece> HubExpertPieces(const std::string& name, const std::vector<int64_t>& shape) {
  static const std::string kGateUp = "mlp.experts.gate_up_proj", kDown = "mlp.experts.down_proj";
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const bool gate_up = ends(kGateUp), down = ends(kDown);
  if (shape.size() != 3 || !(gate_up || down)) return {};
  const std::string prefix = name.substr(0, name.size() - (gate_up ? kGateUp.size() : kDown.size())) + "mlp.experts.";
  std::vector<HubExpertPiece> out;
  for (int64_t e = 0; e < shape[0]; ++e) {
    if (gate_up) {
      const int64_t i = shape[1] / 2;
      out.push_back({absl::StrCat(prefix, e, ".gate_proj.weight"), e, 0, i, {i, shape[2]}});
      out.push_back({absl::StrCat(prefix, e, ".up_proj.weight"), e, i, i, {i, shape[2]}});
    } else {
      out.push_back({absl::StrCat(prefix, e, ".down_proj.weight"), e, 0, shape[1], {shape[1], shape[2]}});
    }
  }
  return out;
}

}  // namespace rp::files
