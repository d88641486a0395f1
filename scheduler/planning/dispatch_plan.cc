#include "scheduler/planning/dispatch_plan.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rp::planning {

const char* OptimizerModeName(OptimizerMode m) { return m == OptimizerMode::kSync ? "sync" : "async"; }

const char* SlotKindName(spec::StageKind k) {
  switch (k) {
    case spec::StageKind::kForward:
      return "forward";
    case spec::StageKind::kFused:
      return "fused";
    case spec::StageKind::kBackward:
      return "backward";
    case spec::StageKind::kEval:
      return "eval";
  }
  return "?";
}

namespace {

absl::Status ValidateDispatch(const Partition& p, int num_layers, const DispatchOptions& opt) {
  if (opt.num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch: need at least one worker, got ", opt.num_workers));
  }
  if (opt.microbatches_per_iteration < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatch: need at least one micro-batch per iteration, got ", opt.microbatches_per_iteration));
  }
  if (opt.iterations < 1) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch: need at least one iteration, got ", opt.iterations));
  }
  const int M = opt.microbatches_per_iteration;
  const int MR = opt.microbatches_per_round == 0 ? M : opt.microbatches_per_round;
  if (MR < opt.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatch: a round needs at least as many micro-batches as workers "
                     "(M_R=",
                     MR, " < N=", opt.num_workers, "); otherwise slot i+N would wait on its own worker"));
  }
  if (MR < 1 || M % MR != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatch: micro-batches per iteration (", M, ") must be a multiple of M_R (", MR, ")"));
  }
  if (opt.g0 < 0 || opt.g0 >= opt.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch: g0=", opt.g0, " outside 0..", opt.num_workers - 1));
  }
  // Shape checks (the partitioner validates costs; here only the layer bookkeeping).
  int fsum = p.fused, bsum = p.fused;
  for (int n : p.forward) fsum += n < 1 ? num_layers + 1 : n;
  for (int n : p.backward) bsum += n < 1 ? num_layers + 1 : n;
  if (p.fused < 1 || fsum != num_layers || bsum != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatch: partition ", p.ToString(), " does not cover ", num_layers, " layers"));
  }
  return absl::OkStatus();
}

// One slot of a round's stage layout (the same in every round and iteration).
struct SlotShape {
  spec::StageKind kind;
  int stage, first, count;
};

// Forward stages bottom-up, the fused stage at the top, then the backward stages top-down.
std::vector<SlotShape> RoundLayout(const Partition& p, int num_layers) {
  std::vector<SlotShape> shapes;
  int first = 0;
  for (size_t i = 0; i < p.forward.size(); ++i) {
    shapes.push_back({spec::StageKind::kForward, static_cast<int>(i) + 1, first, p.forward[i]});
    first += p.forward[i];
  }
  shapes.push_back({spec::StageKind::kFused, 1, num_layers - p.fused, p.fused});
  int top = num_layers - p.fused;
  for (size_t j = 0; j < p.backward.size(); ++j) {
    top -= p.backward[j];
    shapes.push_back({spec::StageKind::kBackward, static_cast<int>(j) + 2, top, p.backward[j]});
  }
  return shapes;
}

// What slot i of a round (its slots numbered from `base`) waits for: the slot before it (an
// activation forward, a gradient backward) and, for a backward slot, the forward slot whose
// output is its recompute checkpoint (the input of its first layer).
std::vector<SlotDependency> SlotDeps(const std::vector<SlotShape>& shapes, int base, int i) {
  std::vector<SlotDependency> deps;
  const SlotShape& me = shapes[static_cast<size_t>(i)];
  if (i > 0) {
    deps.push_back({base + i - 1, me.kind == spec::StageKind::kForward || me.kind == spec::StageKind::kFused
                                      ? SlotDependency::Reason::kActivation
                                      : SlotDependency::Reason::kGradient});
  }
  if (me.kind == spec::StageKind::kBackward && me.first > 0) {
    for (int k = 0; k < static_cast<int>(shapes.size()); ++k) {
      const SlotShape& f = shapes[static_cast<size_t>(k)];
      if (f.kind == spec::StageKind::kForward && f.first <= me.first - 1 && me.first - 1 < f.first + f.count) {
        if (base + k != base + i - 1) deps.push_back({base + k, SlotDependency::Reason::kCheckpoint});
      }
    }
  }
  return deps;
}

}  // namespace

absl::StatusOr<DispatchPlan> BuildDispatchPlan(const Partition& p, int num_layers, const DispatchOptions& opt) {
  if (absl::Status st = ValidateDispatch(p, num_layers, opt); !st.ok()) return st;
  const int M = opt.microbatches_per_iteration;
  const int MR = opt.microbatches_per_round == 0 ? M : opt.microbatches_per_round;
  DispatchPlan plan;
  plan.options = opt;
  plan.options.microbatches_per_round = MR;
  plan.partition = p;
  plan.num_layers = num_layers;
  plan.rounds_per_iteration = M / MR;

  const std::vector<SlotShape> shapes = RoundLayout(p, num_layers);
  const int S = static_cast<int>(shapes.size());
  int g0 = opt.g0;
  for (int it = 0; it < opt.iterations; ++it) {
    for (int r = 0; r < plan.rounds_per_iteration; ++r) {
      const int base = static_cast<int>(plan.slots.size());
      for (int i = 0; i < S; ++i) {
        const SlotShape& shape = shapes[static_cast<size_t>(i)];
        StageSlot s;
        s.index = base + i;
        s.iteration = it;
        s.round = r;
        s.slot_in_round = i;
        s.kind = shape.kind;
        s.stage = shape.stage;
        s.first_layer = shape.first;
        s.num_layers = shape.count;
        s.first_microbatch = r * MR;
        s.num_microbatches = MR;
        s.worker = (g0 + i) % opt.num_workers;  // slot i -> worker (g0 + i) mod N
        s.deps = SlotDeps(shapes, base, i);
        plan.slots.push_back(std::move(s));
      }
      g0 = (g0 + S) % opt.num_workers;
    }
  }
  plan.next_g0 = g0;
  return plan;
}

}  // namespace rp::planning
