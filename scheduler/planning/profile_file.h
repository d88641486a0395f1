// profile_file.h — a model's measured per-layer costs as a JSON file, the one format both ways:
// the engine writes the profile it measured for a job, `roundpipe-sim --profile FILE` replays it
// (or one written by hand, or from another system's measurements) to explore schedules.
//
//   {
//     "format": "roundpipe.profile.v1",
//     "name": "free text (model, device, batch shape)",
//     "tokens_per_microbatch": 8192,         // optional: activation memory; 0 = ignore
//     "boundary_bytes_per_token": 8192,      // optional: stage-boundary activation bytes per token
//     "activation_hop_s": 0.0021,            // optional: one micro-batch's boundary activation
//                                            // device -> host -> device (simulated with --transfers)
//     "layers": [                            // engine order: embedding, blocks..., head
//       {"kind": "embedding" | "block" | "head",
//        "forward_s": 0.001,                 // forward, no autograd, one micro-batch
//        "backward_s": 0.003,                // recompute + backward
//        "fused_s": 0.004,                   // forward with autograd + backward (B_1), head: + loss
//        "param_bytes": 0,                   // optional, master copy uploaded per stage
//        "trainable_bytes": 0,               // optional, gradient bytes downloaded
//        "activation_bytes_per_token": 0,    // optional, what autograd keeps per token
//        "fixed_work_bytes": 0}              // optional, token-independent work buffers
//     ]
//   }
//
// Contract: pure functions. ParseProfile refuses anything else with InvalidArgument naming the
// field (and the layer): a wrong format tag, a missing or negative time, a non-number, no layers,
// more than 100,000 layers.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/planning/cost_model.h"

namespace rp::planning {

struct Profile {
  std::string name;
  CostModel costs;
  double activation_hop_s = -1;  // < 0: not measured (the simulator derives it from bytes)
};

absl::StatusOr<Profile> ParseProfile(absl::string_view json);
std::string ProfileJson(const Profile& profile);

}  // namespace rp::planning
