// stage_kind.h — the kinds of stage slot in a RoundPipe iteration, shared by the planner's
// dispatch plan and the workers' stage tasks: F_i (forward), B_1 (the fused first backward
// stage: forward + loss + backward), B_j (backward, recomputing from checkpoints), and in an
// evaluation pass E, B_1's place without autograd (forward + loss only; no backward stage, no
// gradient and no optimizer step follow). The planner never makes kEval slots.
//
// Contract: a plain enum.
#pragma once

namespace rp::spec {

enum class StageKind { kForward, kFused, kBackward, kEval };

}  // namespace rp::spec
