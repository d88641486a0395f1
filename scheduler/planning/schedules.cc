#include "scheduler/planning/schedules.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "scheduler/planning/partition.h"

namespace rp::planning {
namespace {

double StageTime(const CostModel& c, spec::StageKind kind, int first, int n) {
  double s = 0;
  for (int l = first; l < first + n; ++l) {
    const LayerCost& x = c.layers[static_cast<size_t>(l)];
    s += kind == spec::StageKind::kForward ? x.fwd_s : (kind == spec::StageKind::kFused ? x.fused_s : x.bwd_s);
  }
  return s;
}

TaskPhase PhaseOf(spec::StageKind k) {
  return k == spec::StageKind::kForward ? TaskPhase::kForward
                                        : (k == spec::StageKind::kFused ? TaskPhase::kFused : TaskPhase::kBackward);
}

// An optimizer step on the CPU optimizer resource (layer -1: the whole model).
SimTask OptimizerTask(int resource, double duration_s, int iteration, int layer) {
  SimTask t;
  t.resource = resource;
  t.duration_s = duration_s;
  t.phase = TaskPhase::kOptimizer;
  t.iteration = iteration;
  t.microbatch = -1;
  t.layer = layer;
  return t;
}

// Device -> host -> device time of one micro-batch's stage-boundary activation (0 = not modelled).
double ActivationLatency(const CostModel& costs, const SimOptions& o) {
  if (!o.transfers) return 0.0;
  if (o.activation_hop_s >= 0) return o.activation_hop_s;
  if (!(o.host_link_bandwidth > 0)) return 0.0;
  return 2.0 * static_cast<double>(costs.boundary_bytes_per_token * costs.tokens_per_microbatch) /
         o.host_link_bandwidth;
}

void NameResources(SimSchedule& s, bool links, bool grad_links = false) {
  s.resource_names.clear();
  for (int w = 0; w < s.num_workers; ++w) s.resource_names.push_back(absl::StrCat("gpu", w));
  s.resource_names.push_back("optimizer");
  if (links) {
    for (int w = 0; w < s.num_workers; ++w) s.resource_names.push_back(absl::StrCat("gpu", w, "-param-up"));
  }
  if (links && grad_links) {
    for (int w = 0; w < s.num_workers; ++w) s.resource_names.push_back(absl::StrCat("gpu", w, "-grad-down"));
  }
  s.num_resources = static_cast<int>(s.resource_names.size());
  s.order.resize(static_cast<size_t>(s.num_resources));
}

}  // namespace

const char* BaselineName(Baseline b) {
  switch (b) {
    case Baseline::kGPipe:
      return "GPipe";
    case Baseline::k1F1B:
      return "1F1B";
    case Baseline::kInterleaved1F1B:
      return "Interleaved-1F1B";
    case Baseline::kLoopedBFS:
      return "Looped-BFS";
  }
  return "?";
}

namespace {

// Lays out a RoundPipe dispatch plan as simulator tasks, slot by slot: the weight upload (when
// transfers are modelled), the micro-batches, and the optimizer tasks with the consistency
// protocol's edges.
class RoundPipeLayout {
 public:
  RoundPipeLayout(const DispatchPlan& plan, const CostModel& costs, const SimOptions& o)
      : plan_(plan),
        costs_(costs),
        o_(o),
        N_(plan.options.num_workers),
        K_(plan.options.iterations),
        L_(plan.num_layers),
        async_(plan.options.mode == OptimizerMode::kAsync),
        act_latency_(ActivationLatency(costs, o)),
        first_task_(plan.slots.size(), -1),
        upload_task_(plan.slots.size(), -1),
        grads_done_(plan.slots.size(), -1),
        last_slot_on_worker_(static_cast<size_t>(N_), -1),
        sync_opt_(static_cast<size_t>(K_), -1),
        opt_task_(async_ ? static_cast<size_t>(K_) * static_cast<size_t>(L_) : 0, -1) {
    s_.name = absl::StrCat("RoundPipe-", OptimizerModeName(plan.options.mode));
    s_.balance_all_phases_together = true;
    s_.num_workers = N_;
    s_.iterations = K_;
    NameResources(s_, o.transfers, /*grad_links=*/true);
  }

  SimSchedule Build() && {
    int built_iterations = 0;
    for (size_t i = 0; i < plan_.slots.size(); ++i) {
      const StageSlot& sl = plan_.slots[i];
      // Optimizer tasks of iteration k need the slots of iteration k+1 (async), so they are
      // created once iteration k+1 is laid out; sync ones right after their iteration.
      const int ready = async_ ? sl.iteration - 1 : sl.iteration;
      while (built_iterations < ready) AddOptimizerTasks(built_iterations++);
      std::vector<TaskDep> weight_deps = WeightDeps(sl);
      const bool weights_move = o_.transfers && o_.weight_transfers;
      if (weights_move) weight_deps = {{AddUpload(i, weight_deps)}};
      AddMicrobatches(i, weight_deps);
      if (weights_move) AddGradDownload(i);
      last_slot_on_worker_[static_cast<size_t>(sl.worker)] = static_cast<int>(i);
    }
    while (built_iterations < K_) AddOptimizerTasks(built_iterations++);
    for (size_t i = 0; i < plan_.slots.size(); ++i) {
      s_.slots.push_back({upload_task_[i], first_task_[i], plan_.slots[i].num_microbatches, grads_done_[i]});
    }
    return std::move(s_);
  }

 private:
  // What a slot's weights must wait for: the previous iteration's step (sync, at a round's first
  // slot), or P_cp of iteration T-2 for each of its layers (async, constraint 2).
  std::vector<TaskDep> WeightDeps(const StageSlot& sl) const {
    std::vector<TaskDep> deps;
    if (!async_ && sl.iteration > 0 && sl.slot_in_round == 0) {
      deps.push_back({sync_opt_[static_cast<size_t>(sl.iteration - 1)]});
    }
    if (async_ && sl.iteration >= 2) {
      for (int l = sl.first_layer; l < sl.first_layer + sl.num_layers; ++l) {
        deps.push_back({opt_task_[static_cast<size_t>(sl.iteration - 2) * L_ + l]});
      }
    }
    return deps;
  }

  // The slot's parameter upload on its worker's link; it may start once the worker's previous
  // slot started (the link prefetches while the GPU computes).
  int AddUpload(size_t i, const std::vector<TaskDep>& weight_deps) {
    const StageSlot& sl = plan_.slots[i];
    SimTask up;
    up.resource = N_ + 1 + sl.worker;
    int64_t bytes = 0;
    for (int l = sl.first_layer; l < sl.first_layer + sl.num_layers; ++l) {
      bytes += costs_.layers[static_cast<size_t>(l)].param_bytes;
    }
    up.duration_s = static_cast<double>(bytes) / o_.host_link_bandwidth;
    up.phase = TaskPhase::kParamUpload;
    up.iteration = sl.iteration;
    up.stage = sl.slot_in_round;
    up.microbatch = -1;
    up.deps = weight_deps;
    const int prev = last_slot_on_worker_[static_cast<size_t>(sl.worker)];
    if (prev >= 0) up.deps.push_back({first_task_[static_cast<size_t>(prev)], 0, /*on_start=*/true});
    upload_task_[i] = s_.Add(std::move(up));
    return upload_task_[i];
  }

  // A training slot's weight gradients to the host on its worker's download link, after its last
  // micro-batch (the engine downloads them whole once the weights are done); the optimizer needs
  // them. Chunks interleaved with the next slot's activation downloads are not modelled.
  void AddGradDownload(size_t i) {
    const StageSlot& sl = plan_.slots[i];
    if (sl.kind == spec::StageKind::kForward) return;
    SimTask down;
    down.resource = 2 * N_ + 1 + sl.worker;
    int64_t bytes = 0;
    for (int l = sl.first_layer; l < sl.first_layer + sl.num_layers; ++l) {
      bytes += costs_.layers[static_cast<size_t>(l)].trainable_bytes;
    }
    down.duration_s = static_cast<double>(bytes) / o_.host_link_bandwidth;
    down.phase = TaskPhase::kGradDownload;
    down.iteration = sl.iteration;
    down.stage = sl.slot_in_round;
    down.microbatch = -1;
    down.deps = {{first_task_[i] + sl.num_microbatches - 1}};
    grads_done_[i] = s_.Add(std::move(down));
  }

  // The task after which slot i's gradients are on the host: its download, or (no transfers)
  // its last micro-batch.
  int GradsDone(size_t i) const {
    return grads_done_[i] >= 0 ? grads_done_[i] : first_task_[i] + plan_.slots[i].num_microbatches - 1;
  }

  // The slot's micro-batches as consecutive task ids; each waits for the same micro-batch of the
  // slots it depends on (plus the activation's round trip through host memory).
  void AddMicrobatches(size_t i, const std::vector<TaskDep>& weight_deps) {
    const StageSlot& sl = plan_.slots[i];
    const double dur = StageTime(costs_, sl.kind, sl.first_layer, sl.num_layers);
    // Recompute ahead: the forward share of a backward stage needs only its weights and the
    // checkpoint; the upstream gradient gates the rest.
    const bool ahead = o_.recompute_ahead && sl.kind == spec::StageKind::kBackward && dur > 0;
    const bool early = o_.early_starts_before_inputs && sl.kind != spec::StageKind::kForward && dur > 0;
    const double head =
        ahead || early
            ? std::min(1.0, StageTime(costs_, spec::StageKind::kForward, sl.first_layer, sl.num_layers) / dur)
            : 0.0;
    for (int m = 0; m < sl.num_microbatches; ++m) {
      SimTask t;
      t.resource = sl.worker;
      t.duration_s = dur;
      t.head_fraction = head;
      t.phase = PhaseOf(sl.kind);
      t.iteration = sl.iteration;
      t.stage = sl.slot_in_round;
      t.microbatch = sl.first_microbatch + m;
      if (m == 0) t.deps = weight_deps;
      for (const SlotDependency& d : sl.deps) {
        const bool checkpoint = d.reason == SlotDependency::Reason::kCheckpoint;
        t.deps.push_back({first_task_[static_cast<size_t>(d.slot)] + m, checkpoint ? 0.0 : act_latency_, false,
                          /*tail_only=*/early || (ahead && d.reason == SlotDependency::Reason::kGradient)});
      }
      const int id = s_.Add(std::move(t));
      if (m == 0) first_task_[i] = id;
    }
  }

  void AddOptimizerTasks(int k) {
    if (!async_) {
      SimTask t = OptimizerTask(N_, o_.optimizer_s_per_layer * L_, k, -1);
      for (size_t i = 0; i < plan_.slots.size(); ++i) {
        const StageSlot& sl = plan_.slots[i];
        if (sl.iteration != k) continue;
        for (int m = 0; m < sl.num_microbatches; ++m) t.deps.push_back({first_task_[i] + m});
        if (sl.kind != spec::StageKind::kForward) t.deps.push_back({GradsDone(i)});
      }
      sync_opt_[static_cast<size_t>(k)] = s_.Add(std::move(t));
      return;
    }
    for (int l = L_ - 1; l >= 0; --l) {
      SimTask t = OptimizerTask(N_, o_.optimizer_s_per_layer, k, l);
      for (size_t i = 0; i < plan_.slots.size(); ++i) {
        const StageSlot& sl = plan_.slots[i];
        const bool covers = sl.first_layer <= l && l < sl.first_layer + sl.num_layers;
        if (!covers) continue;
        if (sl.iteration == k && sl.kind != spec::StageKind::kForward) {
          // Constraint 3: every gradient micro-batch of layer l has been downloaded.
          t.deps.push_back({GradsDone(i)});
        }
        if (sl.iteration == k + 1) {
          // Constraint 1: P_cp overwrites the master copy only after iteration k+1 uploaded it.
          const int up = upload_task_[i] >= 0 ? upload_task_[i] : first_task_[i];
          t.deps.push_back({up, 0, /*on_start=*/upload_task_[i] < 0});
        }
      }
      opt_task_[static_cast<size_t>(k) * L_ + l] = s_.Add(std::move(t));
    }
  }

  const DispatchPlan& plan_;
  const CostModel& costs_;
  const SimOptions& o_;
  const int N_, K_, L_;
  const bool async_;
  const double act_latency_;
  SimSchedule s_;
  std::vector<int> first_task_;   // per slot: the task id of its first micro-batch
  std::vector<int> upload_task_;  // per slot: its upload task (transfers only)
  std::vector<int> grads_done_;   // per slot: its gradient download task (transfers, training slots)
  std::vector<int> last_slot_on_worker_;
  std::vector<int> sync_opt_;  // sync: per iteration
  std::vector<int> opt_task_;  // async: [k * L + l]
};

}  // namespace

absl::StatusOr<SimSchedule> RoundPipeSchedule(const DispatchPlan& plan, const CostModel& costs, const SimOptions& o) {
  if (costs.num_layers() != plan.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulate: plan has ", plan.num_layers, " layers, cost model ", costs.num_layers()));
  }
  if (o.transfers && !(o.host_link_bandwidth > 0)) {
    return absl::InvalidArgumentError("simulate: transfers need a positive host link bandwidth");
  }
  return RoundPipeLayout(plan, costs, o).Build();
}

namespace {

// The layers of each of a baseline's S stages: min-max contiguous (under the memory cap), or
// the user's Megatron-style block counts with the embedding joining the first stage and the
// head the last.
absl::StatusOr<std::vector<int>> BaselineStageLayers(Baseline kind, const CostModel& costs, const BaselineOptions& bo,
                                                     int S) {
  const int L = costs.num_layers();
  if (bo.blocks_per_stage.empty()) {
    std::vector<double> w;
    std::vector<int64_t> mem;
    for (int l = 0; l < L; ++l) {
      w.push_back(costs.layers[static_cast<size_t>(l)].fwd_s + costs.layers[static_cast<size_t>(l)].bwd_s);
      mem.push_back(costs.BackwardMemory(l));
    }
    return MinMaxContiguousPartition(w, mem, bo.stage_memory_cap, S);
  }
  const std::vector<int>& b = bo.blocks_per_stage;
  int blocks = 0;
  for (size_t st = 0; st < b.size(); ++st) {
    const bool end = st == 0 || st + 1 == b.size();
    if (b[st] < 0 || (b[st] == 0 && !end)) {
      return absl::InvalidArgumentError(absl::StrCat("baseline ", BaselineName(kind), ": stage ", st, " lists ", b[st],
                                                     " blocks (only the first and the last may list 0)"));
    }
    blocks += b[st];
  }
  if (static_cast<int>(b.size()) != S || blocks != L - 2) {
    return absl::InvalidArgumentError(absl::StrCat("baseline ", BaselineName(kind), ": the partition lists ", b.size(),
                                                   " stages of ", blocks, " blocks; this schedule has ", S,
                                                   " stages and the model ", L - 2, " blocks"));
  }
  std::vector<int> parts = b;
  parts[0] += 1;
  parts[static_cast<size_t>(S - 1)] += 1;
  return parts;
}

// One operation of a worker's order: the forward or backward of `stage` on micro-batch `mb`.
struct BaselineOp {
  bool bwd;
  int stage, mb;
};

// Worker g's execution order under `kind` (N workers, M micro-batches, v chunks per worker,
// S = v N stages).
std::vector<BaselineOp> BaselineOrder(Baseline kind, int g, int N, int M, int v, int S) {
  std::vector<BaselineOp> q;
  switch (kind) {
    case Baseline::kGPipe:
      for (int m = 0; m < M; ++m) q.push_back({false, g, m});
      for (int m = 0; m < M; ++m) q.push_back({true, g, m});
      break;
    case Baseline::k1F1B: {
      const int warm = std::min(S - g - 1, M);
      int f = 0, b = 0;
      for (; f < warm; ++f) q.push_back({false, g, f});
      while (f < M) {
        q.push_back({false, g, f++});
        q.push_back({true, g, b++});
      }
      while (b < M) q.push_back({true, g, b++});
      break;
    }
    case Baseline::kLoopedBFS:
      for (int c = 0; c < v; ++c)
        for (int m = 0; m < M; ++m) q.push_back({false, c * N + g, m});
      for (int c = v - 1; c >= 0; --c)
        for (int m = 0; m < M; ++m) q.push_back({true, c * N + g, m});
      break;
    case Baseline::kInterleaved1F1B: {
      // Forward k-th op: chunk (k mod Nv)/N, micro-batch (k / Nv)*N + k mod N; backward uses
      // the chunks in reverse. Warm-up as in Megatron-LM's interleaved schedule.
      const int total = M * v;
      auto fwd_op = [&](int k) {
        const int chunk = (k % (N * v)) / N;
        return BaselineOp{false, chunk * N + g, (k / (N * v)) * N + k % N};
      };
      auto bwd_op = [&](int k) {
        const int chunk = v - 1 - (k % (N * v)) / N;
        return BaselineOp{true, chunk * N + g, (k / (N * v)) * N + k % N};
      };
      const int warm = std::min((N - g - 1) * 2 + (v - 1) * N, total);
      int f = 0, b = 0;
      for (; f < warm; ++f) q.push_back(fwd_op(f));
      while (f < total) {
        q.push_back(fwd_op(f++));
        q.push_back(bwd_op(b++));
      }
      while (b < total) q.push_back(bwd_op(b++));
      break;
    }
  }
  return q;
}

// The tasks of K iterations of a baseline into `s`: per-GPU order from `ops`, stage times tf /
// tb, activations crossing stages after `act_latency`, each iteration's first forwards after
// the previous optimizer step (a flush).
void AddBaselineIterations(const std::vector<std::vector<BaselineOp>>& ops, const std::vector<double>& tf,
                           const std::vector<double>& tb, double act_latency, double optimizer_s, int K, int M,
                           SimSchedule& s) {
  const int N = static_cast<int>(ops.size()), S = static_cast<int>(tf.size());
  // Task ids: id(it, bwd, stage, mb), created in per-GPU order, iteration by iteration.
  std::vector<int> id(static_cast<size_t>(K) * 2 * S * M, -1);
  auto idx = [&](int it, bool bwd, int st, int m) {
    return ((static_cast<size_t>(it) * 2 + (bwd ? 1 : 0)) * S + st) * M + m;
  };
  int prev_opt = -1;
  for (int it = 0; it < K; ++it) {
    // Create every task first (ids), then fill dependencies.
    for (int g = 0; g < N; ++g) {
      for (const BaselineOp& op : ops[static_cast<size_t>(g)]) {
        SimTask t;
        t.resource = g;
        t.duration_s = op.bwd ? tb[static_cast<size_t>(op.stage)] : tf[static_cast<size_t>(op.stage)];
        t.phase = op.bwd ? TaskPhase::kBackward : TaskPhase::kForward;
        t.iteration = it;
        t.stage = op.stage;
        t.microbatch = op.mb;
        id[idx(it, op.bwd, op.stage, op.mb)] = s.Add(std::move(t));
      }
    }
    for (int st = 0; st < S; ++st) {
      for (int m = 0; m < M; ++m) {
        SimTask& f = s.tasks[static_cast<size_t>(id[idx(it, false, st, m)])];
        if (st > 0) f.deps.push_back({id[idx(it, false, st - 1, m)], act_latency});
        if (st == 0 && prev_opt >= 0) f.deps.push_back({prev_opt});
        SimTask& b = s.tasks[static_cast<size_t>(id[idx(it, true, st, m)])];
        if (st == S - 1) {
          b.deps.push_back({id[idx(it, false, st, m)]});
        } else {
          b.deps.push_back({id[idx(it, true, st + 1, m)], act_latency});
        }
      }
    }
    SimTask opt = OptimizerTask(N, optimizer_s, it, -1);
    for (int st = 0; st < S; ++st)
      for (int m = 0; m < M; ++m) opt.deps.push_back({id[idx(it, true, st, m)]});
    prev_opt = s.Add(std::move(opt));
  }
}

}  // namespace

absl::StatusOr<SimSchedule> BaselineSchedule(Baseline kind, const CostModel& costs, const BaselineOptions& bo,
                                             const SimOptions& o, std::vector<int>* stage_layers) {
  const int N = bo.num_workers, M = bo.num_microbatches, K = bo.iterations, L = costs.num_layers();
  const int v = (kind == Baseline::kGPipe || kind == Baseline::k1F1B) ? 1 : bo.chunks_per_worker;
  if (N < 1 || M < 1 || K < 1 || v < 1) {
    return absl::InvalidArgumentError("baseline: workers, micro-batches, iterations and chunks must be >= 1");
  }
  const int S = v * N;
  if (S > L) {
    return absl::InvalidArgumentError(
        absl::StrCat("baseline ", BaselineName(kind), ": ", S, " stages for ", L, " layers"));
  }
  if (kind == Baseline::kInterleaved1F1B && M % N != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("baseline Interleaved-1F1B: micro-batches (", M, ") must be a multiple of the workers (", N, ")"));
  }
  auto parts = BaselineStageLayers(kind, costs, bo, S);
  if (!parts.ok()) return parts.status();
  if (stage_layers) *stage_layers = *parts;
  std::vector<double> tf(static_cast<size_t>(S)), tb(static_cast<size_t>(S));
  int first = 0;
  for (int st = 0; st < S; ++st) {
    tf[static_cast<size_t>(st)] = StageTime(costs, spec::StageKind::kForward, first, (*parts)[static_cast<size_t>(st)]);
    tb[static_cast<size_t>(st)] =
        StageTime(costs, spec::StageKind::kBackward, first, (*parts)[static_cast<size_t>(st)]);
    first += (*parts)[static_cast<size_t>(st)];
  }
  SimSchedule s;
  s.name = v > 1 ? absl::StrCat(BaselineName(kind), "(v=", v, ")") : std::string(BaselineName(kind));
  s.num_workers = N;
  s.iterations = K;
  NameResources(s, false);
  std::vector<std::vector<BaselineOp>> ops;
  for (int g = 0; g < N; ++g) ops.push_back(BaselineOrder(kind, g, N, M, v, S));
  AddBaselineIterations(ops, tf, tb, ActivationLatency(costs, o), o.optimizer_s_per_layer * L, K, M, s);
  return s;
}

}  // namespace rp::planning
