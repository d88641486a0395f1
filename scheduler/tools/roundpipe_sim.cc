// roundpipe-sim — plan and simulate RoundPipe against weight-bound pipeline schedules.
//
//   roundpipe-sim --model qwen3-1.7b --device rtx4090 --gpus 8 --microbatches 16 --schedule all
//   roundpipe-sim --paper            # the paper's §5.8.1 experiment over its five models
//
// Exit codes: 0 success, 2 bad arguments or an impossible plan, 1 anything else.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "scheduler/planning/cluster_model.h"
#include "scheduler/planning/comparison.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/planning/partition.h"
#include "scheduler/planning/presets.h"
#include "scheduler/planning/profile_file.h"
#include "scheduler/planning/report.h"
#include "scheduler/tools/sim_pool.h"

ABSL_FLAG(
    std::string, model, "qwen3-1.7b",
    "Model preset: the paper's qwen3-1.7b, llama-3.1-8b, gpt-oss-20b, qwen3-32b, qwen3-235b-a22b (LoRA r=32); "
    "also qwen3-30b-a3b, gpt-oss-120b (full fine-tuning needs more than a 24 GB GPU per block), the tiny presets");
ABSL_FLAG(std::string, device, "rtx4090", "Device preset for the analytic cost model: rtx4090, a800, h200");
ABSL_FLAG(int, gpus, 8, "Number of GPU workers N");
ABSL_FLAG(int, microbatches, 16, "Micro-batches per iteration M");
ABSL_FLAG(int, round_size, 0,
          "RoundPipe micro-batches per round M_R (>= gpus; 0 = all in one round; -1 = the automatic partition also "
          "chooses it among the divisors of --microbatches that are >= --gpus)");
ABSL_FLAG(int, micro_batch_size, 4, "Sequences per micro-batch");
ABSL_FLAG(int, seq, 2048, "Sequence length in tokens");
ABSL_FLAG(int, iterations, 4, "Iterations simulated back to back (steady state measured after the first)");
ABSL_FLAG(std::string, schedule, "all",
          "Comma-separated schedules: gpipe, 1f1b, interleaved-1f1b, looped-bfs, roundpipe-sync, "
          "roundpipe-async, or all");
ABSL_FLAG(std::string, format, "table", "Output format: table or json");
ABSL_FLAG(bool, gantt, false, "Print a terminal Gantt chart of the --gantt_schedule schedule");
ABSL_FLAG(std::string, gantt_schedule, "roundpipe-async",
          "Schedule drawn by --gantt and written by --trace (an id from --schedule)");
ABSL_FLAG(int, gantt_width, 120, "Gantt chart width in characters");
ABSL_FLAG(std::string, trace, "",
          "Write a Chrome/Perfetto trace (trace-event JSON) of the --gantt_schedule schedule to this file");
ABSL_FLAG(double, optimizer_ms, 0, "CPU optimizer time per layer per iteration, in ms (0 = free)");
ABSL_FLAG(bool, transfers, false,
          "Model activation transfers, per-slot weight uploads and gradient downloads over the host link");
ABSL_FLAG(bool, early_starts_before_inputs, false,
          "Ablation, impossible on hardware: backward stages' recompute and B_1's head forward start before their "
          "inputs arrive, as the authors' simulator lets them (measures what that freedom is worth)");
ABSL_FLAG(bool, weight_transfers, true,
          "With --transfers: also the weight uploads and gradient downloads (false: activation hops only, as the "
          "authors' simulator models them)");
ABSL_FLAG(std::string, profile, "",
          "A measured profile (JSON, scheduler/planning/profile_file.h: per-layer forward, recompute+backward and "
          "fused times, bytes, the activation hop) to simulate instead of the analytic model; what a job's "
          "auto-partitioned run writes as <output_dir>/profile.json. --model is then ignored; --device still "
          "gives the host link bandwidth for weight uploads with --transfers");
ABSL_FLAG(bool, bytes_from_model, false,
          "With --profile: take every layer's byte counts (parameters, gradients, activations per token, work "
          "buffers) and the boundary activation from --model's analytic model at --micro_batch_size x --seq, "
          "keeping the profile's times, so the per-stage memory cap applies to a profile that has no bytes "
          "(the authors' figures in tests/bench/profiles)");
ABSL_FLAG(std::string, baseline_partition, "",
          "Decoder blocks per stage for the baselines, Megatron-style (e.g. 0,2,2,...,2,0: the first stage also "
          "holds the embedding, the last the head). Used by the baselines whose stage count it matches: GPipe "
          "and 1F1B with N entries, the looped ones with v*N (which fixes v)");
ABSL_FLAG(bool, partition_by_simulation, true,
          "RoundPipe's automatic partition: the candidate of the exact search whose simulated steady state is "
          "best (per optimizer mode); false = the paper's objective alone");
ABSL_FLAG(bool, recompute_ahead, true,
          "RoundPipe backward stages start a micro-batch's recompute before its upstream gradient arrived, as "
          "the engine does; false = the whole stage waits for all its inputs (ablation)");
ABSL_FLAG(double, memory_cap_gib, -1,
          "Per-stage device memory cap in GiB; -1 = (device memory - 2 GiB) / 2 (one stage runs while one is "
          "prefetched); 0 = no cap");
ABSL_FLAG(std::string, partition, "",
          "User RoundPipe partition, e.g. 'F=4,4,3;B1=3;B=2,2,2,2,2,1' (F_1..F_Sf; B_1; B_2..B_Sb layer counts)");
ABSL_FLAG(int, stages, 0, "RoundPipe with exactly this many stage slots (0 = automatic)");
ABSL_FLAG(int, min_stages, 0,
          "The authors' min_stages K for RoundPipe's automatic partition: at least K stage slots, the objective "
          "counting S as at least max(N, K) (0 = off; at most 2L-1)");
ABSL_FLAG(double, t_max_window, 0,
          "The authors' t_max window X >= 1 for RoundPipe's automatic partition: only partitions whose slowest slot "
          "lies in [W, X*W], W the least t_max any partition has (they use 1.1; 0 = off)");
ABSL_FLAG(bool, explain, false,
          "Also print the per-layer costs (embedding, first block, head) and every RoundPipe stage slot with its "
          "time per micro-batch and device memory");
ABSL_FLAG(bool, paper, false,
          "Run the paper's §5.8.1 experiment: the five preset models with the other flags "
          "(defaults: rtx4090, 8 GPUs, 16 micro-batches of 4 x 2048 tokens); prints one summary table");

ABSL_FLAG(std::string, pool, "",
          "Instead of the comparison: jobs of this model side by side on one pool of --gpus workers, one per "
          "listed optimizer mode (e.g. sync,sync,async), each on the partition the simulator picks for its mode "
          "(or --partition), --iterations each; prints each job's end against alone and the pool's makespan and "
          "utilisation against one after another (docs/SIMULATOR.md, \"Several jobs on one pool\")");
ABSL_FLAG(std::string, pool_shares, "", "With --pool: each job's share, comma-separated (default 1 each)");
ABSL_FLAG(std::string, pool_starts_s, "", "With --pool: when each job is submitted, in seconds (default 0 each)");
ABSL_FLAG(std::string, lose_worker, "",
          "Instead of the comparison: ITERATION,SLOT,MICROBATCH: the worker that runs stage slot SLOT (0 = F_1) of "
          "that iteration is lost as that micro-batch starts; prints each iteration's end with and without the loss "
          "(docs/SIMULATOR.md, \"A lost worker\")");
ABSL_FLAG(std::string, lose_worker_mode, "sync", "With --lose_worker: the optimizer mode, sync or async");
ABSL_FLAG(int, nodes, 1,
          "A cluster of this many nodes (data parallel, ZeRO-1): each runs the schedule on its share of "
          "--microbatches micro-batches, steps 1/nodes of the optimizer state (--optimizer_ms divided), and "
          "exchanges its gradients over --link_gbps; prints the cluster's predicted iteration");
ABSL_FLAG(double, link_gbps, 10, "With --nodes: each node's network link, Gbit/s per direction");
ABSL_FLAG(double, link_efficiency, 0.45,
          "With --nodes: the share of --link_gbps the gradient exchange achieves (0.44-0.48 measured by "
          "tests/bench/cluster_bench.sh on shaped links)");

namespace rp::planning {
namespace {

// The profile's layers get `from`'s byte counts (same layer count), times untouched.
absl::Status TakeBytes(const CostModel& from, CostModel* costs) {
  if (from.num_layers() != costs->num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("--bytes_from_model: the model has ", from.num_layers(),
                                                   " layers, the profile ", costs->num_layers()));
  }
  for (size_t l = 0; l < costs->layers.size(); ++l) {
    LayerCost& c = costs->layers[l];
    const LayerCost& b = from.layers[l];
    c.param_bytes = b.param_bytes;
    c.trainable_bytes = b.trainable_bytes;
    c.act_bytes_per_token = b.act_bytes_per_token;
    c.fixed_work_bytes = b.fixed_work_bytes;
  }
  costs->tokens_per_microbatch = from.tokens_per_microbatch;
  costs->boundary_bytes_per_token = from.boundary_bytes_per_token;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> ParseInts(absl::string_view s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v;
    if (!absl::SimpleAtoi(part, &v)) return absl::InvalidArgumentError(absl::StrCat("not an integer: '", part, "'"));
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<Partition> ParsePartition(absl::string_view spec) {
  Partition p;
  bool have_b1 = false;
  for (absl::string_view item : absl::StrSplit(spec, ';', absl::SkipEmpty())) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2) return absl::InvalidArgumentError(absl::StrCat("--partition: '", item, "' is not KEY=VALUES"));
    auto vals = ParseInts(kv[1]);
    if (!vals.ok()) return absl::InvalidArgumentError(absl::StrCat("--partition: ", vals.status().message()));
    if (kv[0] == "F") {
      p.forward = *vals;
    } else if (kv[0] == "B1" && vals->size() == 1) {
      p.fused = vals->front();
      have_b1 = true;
    } else if (kv[0] == "B") {
      p.backward = *vals;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--partition: unknown key '", kv[0], "' (F, B1, B)"));
    }
  }
  if (!have_b1) return absl::InvalidArgumentError("--partition: B1=<layers> is required");
  return p;
}

struct Setup {
  ComparisonOptions options;
  AnalyticOptions analytic;
  DeviceProfile device;
};

absl::StatusOr<Setup> MakeSetup() {
  Setup s;
  auto dev = DevicePreset(absl::GetFlag(FLAGS_device));
  if (!dev.ok()) return dev.status();
  s.device = *dev;
  s.analytic.micro_batch_size = absl::GetFlag(FLAGS_micro_batch_size);
  s.analytic.sequence_length = absl::GetFlag(FLAGS_seq);
  ComparisonOptions& o = s.options;
  o.num_workers = absl::GetFlag(FLAGS_gpus);
  o.num_microbatches = absl::GetFlag(FLAGS_microbatches);
  o.microbatches_per_round = std::max(0, absl::GetFlag(FLAGS_round_size));
  o.choose_round_size = absl::GetFlag(FLAGS_round_size) == -1;
  if (absl::GetFlag(FLAGS_round_size) < -1) return absl::InvalidArgumentError("--round_size must be >= -1");
  o.iterations = absl::GetFlag(FLAGS_iterations);
  if (o.num_workers < 1) return absl::InvalidArgumentError("--gpus must be >= 1");
  if (o.num_microbatches < 1) return absl::InvalidArgumentError("--microbatches must be >= 1");
  if (o.iterations < 1) return absl::InvalidArgumentError("--iterations must be >= 1");
  const double cap = absl::GetFlag(FLAGS_memory_cap_gib);
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  if (cap < 0) {
    o.stage_memory_cap = (s.device.memory_bytes - static_cast<int64_t>(2 * kGiB)) / 2;
  } else {
    o.stage_memory_cap = static_cast<int64_t>(cap * kGiB);
  }
  o.sim.optimizer_s_per_layer = absl::GetFlag(FLAGS_optimizer_ms) / 1e3;
  o.sim.transfers = absl::GetFlag(FLAGS_transfers);
  o.sim.weight_transfers = absl::GetFlag(FLAGS_weight_transfers);
  o.sim.early_starts_before_inputs = absl::GetFlag(FLAGS_early_starts_before_inputs);
  o.sim.recompute_ahead = absl::GetFlag(FLAGS_recompute_ahead);
  o.partition_by_simulation = absl::GetFlag(FLAGS_partition_by_simulation);
  if (const std::string bp = absl::GetFlag(FLAGS_baseline_partition); !bp.empty()) {
    auto blocks = ParseInts(bp);
    if (!blocks.ok())
      return absl::InvalidArgumentError(absl::StrCat("--baseline_partition: ", blocks.status().message()));
    if (static_cast<int>(blocks->size()) % o.num_workers != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--baseline_partition: ", blocks->size(),
                                                     " stages fit no baseline on ", o.num_workers,
                                                     " GPUs (N for GPipe/1F1B, a multiple v*N for the looped ones)"));
    }
    o.baseline_blocks_per_stage = *blocks;
  }
  o.sim.host_link_bandwidth = s.device.host_link_bandwidth;
  const std::string sched = absl::GetFlag(FLAGS_schedule);
  if (sched != "all") o.schedules = absl::StrSplit(sched, ',', absl::SkipEmpty());
  if (!absl::GetFlag(FLAGS_partition).empty()) {
    auto p = ParsePartition(absl::GetFlag(FLAGS_partition));
    if (!p.ok()) return p.status();
    o.user_partition = *p;
  }
  o.fixed_stage_count = absl::GetFlag(FLAGS_stages);
  o.min_stages = absl::GetFlag(FLAGS_min_stages);
  o.t_max_window = absl::GetFlag(FLAGS_t_max_window);
  if (o.min_stages < 0) return absl::InvalidArgumentError("--min_stages must be >= 0");
  if (o.t_max_window != 0 && !(o.t_max_window >= 1)) {
    return absl::InvalidArgumentError("--t_max_window must be >= 1 (or 0: no window)");
  }
  if ((o.min_stages > 0 || o.t_max_window > 0) && (o.user_partition || o.fixed_stage_count > 0)) {
    return absl::InvalidArgumentError(
        "--min_stages/--t_max_window steer the automatic partition; leave them out with --partition or --stages");
  }
  return s;
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "roundpipe-sim: %s\n", std::string(st.message()).c_str());
  return st.code() == absl::StatusCode::kInvalidArgument || st.code() == absl::StatusCode::kNotFound ||
                 st.code() == absl::StatusCode::kResourceExhausted
             ? 2
             : 1;
}

void Explain(const CostModel& costs, const Setup& setup) {
  std::printf("\nper-layer costs per micro-batch (ms; memory in MiB):\n%-10s %9s %9s %9s %10s %10s\n", "layer", "fwd",
              "bwd+recomp", "fused", "fwd mem", "bwd mem");
  const int L = costs.num_layers();
  for (int l : {0, 1, L - 1}) {
    const LayerCost& c = costs.layers[static_cast<size_t>(l)];
    std::printf("%-10s %9.2f %9.2f %9.2f %10.0f %10.0f\n", l == 0 ? "embedding" : (l == L - 1 ? "head" : "block"),
                c.fwd_s * 1e3, c.bwd_s * 1e3, c.fused_s * 1e3, costs.ForwardMemory(l) / 1048576.0,
                costs.BackwardMemory(l) / 1048576.0);
  }
  PartitionProblem pr{&costs, setup.options.num_workers, setup.options.num_microbatches,
                      setup.options.stage_memory_cap};
  pr.min_stages = setup.options.min_stages;
  pr.t_max_window = setup.options.t_max_window;
  auto part = AutoPartition(pr);
  if (!part.ok()) return;
  std::printf("\nRoundPipe stage slots (automatic partition %s, objective %.3f s, model bubble %.2f%%):\n",
              part->partition.ToString().c_str(), part->objective, 100 * part->predicted_bubble);
  int i = 0;
  for (const StageShape& st : DescribeStages(part->partition, costs)) {
    const char* kind =
        st.kind == spec::StageKind::kForward ? "forward" : (st.kind == spec::StageKind::kFused ? "fused" : "backward");
    std::printf("  slot %2d %-8s layers %3d..%-3d %9.2f ms %8.0f MiB\n", i++, kind, st.first_layer,
                st.first_layer + st.num_layers - 1, st.time_s * 1e3, st.memory_bytes / 1048576.0);
  }
}

// A cluster of `nodes` (cluster_model.h): each node's RoundPipe iteration on its share, the
// gradient exchange at --link_gbps, and the cluster's iteration and tokens/s, sync and async.
void PrintCluster(const CostModel& costs, const Setup& setup, const std::vector<ComparisonRow>& rows, int nodes) {
  double node_s[2] = {-1, -1};
  for (const ComparisonRow& r : rows) {
    if (r.schedule == "RoundPipe-sync") node_s[0] = r.bubbles.period_s;
    if (r.schedule == "RoundPipe-async") node_s[1] = r.bubbles.period_s;
  }
  ClusterOptions co;
  co.nodes = nodes;
  co.link_bytes_per_s = absl::GetFlag(FLAGS_link_gbps) * 1e9 / 8;
  co.link_efficiency = absl::GetFlag(FLAGS_link_efficiency);
  const double node_opt_s = setup.options.sim.optimizer_s_per_layer * costs.num_layers();
  const ClusterPrediction p = PredictCluster(costs, co, node_s[0], node_s[1], node_opt_s);
  const double tokens = static_cast<double>(nodes) * setup.options.num_microbatches *
                        static_cast<double>(setup.analytic.micro_batch_size * setup.analytic.sequence_length);
  std::printf(
      "\ncluster of %d nodes, %.1f Gbit/s links: %lld trainable elements; each node sends %.1f MiB per step "
      "(reduce-scatter + all-gather of fp32), %.3f s on its link\n",
      nodes, absl::GetFlag(FLAGS_link_gbps), static_cast<long long>(p.trainable_elements),
      static_cast<double>(p.wire_bytes_per_node) / (1 << 20), p.exchange_s);
  std::printf("%-16s %14s %14s %16s\n", "mode", "node iter (s)", "cluster (s)", "cluster tok/s");
  const struct {
    const char* name;
    double node, cluster;
  } modes[] = {{"roundpipe-sync", node_s[0], p.sync_iteration_s}, {"roundpipe-async", node_s[1], p.async_iteration_s}};
  for (const auto& m : modes) {
    if (m.node < 0) continue;  // not among --schedule
    std::printf("%-16s %14.3f %14.3f %16.0f\n", m.name, m.node, m.cluster, m.cluster > 0 ? tokens / m.cluster : 0);
  }
}

int RunPaper(const Setup& setup) {
  std::printf(
      "RoundPipe §5.8.1 reproduction: analytic %s cost model, N=%d GPUs, M=%d micro-batches of %lld x %lld "
      "tokens, %d iterations (steady state)\n",
      setup.device.name.c_str(), setup.options.num_workers, setup.options.num_microbatches,
      static_cast<long long>(setup.analytic.micro_batch_size), static_cast<long long>(setup.analytic.sequence_length),
      setup.options.iterations);
  std::vector<std::string> header = {"model"};
  std::string out;
  bool first = true;
  for (const std::string& name : PaperModelPresetNames()) {
    auto model = ModelPreset(name);
    auto costs = AnalyticCostModel(*model, setup.device, setup.analytic);
    if (!costs.ok()) return Fail(costs.status());
    ComparisonOptions o = setup.options;
    o.user_partition.reset();
    o.fixed_stage_count = 0;
    auto rows = CompareSchedules(*costs, o);
    if (!rows.ok()) return Fail(absl::Status(rows.status().code(), absl::StrCat(name, ": ", rows.status().message())));
    if (first) {
      out += absl::StrFormat("%-17s", "bubble % (stages)");
      for (const auto& r : *rows) out += absl::StrFormat(" %22s", r.schedule);
      out += "\n";
      first = false;
    }
    out += absl::StrFormat("%-17s", name);
    for (const auto& r : *rows) {
      out += absl::StrFormat(" %15.2f (%4d)", TablePercent(r.bubbles.total), r.stages);
    }
    out += "\n";
  }
  std::printf("%s", out.c_str());
  std::printf("(bubble = 1 - GPU work / (N x steady-state iteration time); looped baselines use their best v)\n");
  return 0;
}

int Main() {
  auto setup = MakeSetup();
  if (!setup.ok()) return Fail(setup.status());
  if (absl::GetFlag(FLAGS_paper)) return RunPaper(*setup);

  absl::StatusOr<CostModel> costs;
  std::string model_name;
  if (const std::string file = absl::GetFlag(FLAGS_profile); !file.empty()) {
    std::ifstream in(file);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("--profile: cannot read '", file, "'")));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto prof = ParseProfile(text);
    if (!prof.ok())
      return Fail(absl::InvalidArgumentError(absl::StrCat("--profile '", file, "': ", prof.status().message())));
    costs = prof->costs;
    model_name = absl::StrCat("profile '", file, "'", prof->name.empty() ? "" : " (" + prof->name + ")");
    if (absl::GetFlag(FLAGS_bytes_from_model)) {
      auto model = ModelPreset(absl::GetFlag(FLAGS_model));
      if (!model.ok()) return Fail(model.status());
      auto bytes = AnalyticCostModel(*model, setup->device, setup->analytic);
      if (!bytes.ok()) return Fail(bytes.status());
      if (absl::Status st = TakeBytes(*bytes, &*costs); !st.ok()) return Fail(st);
      absl::StrAppend(&model_name, ", bytes from ", model->name);
    }
    setup->options.sim.activation_hop_s = prof->activation_hop_s;
  } else {
    auto model = ModelPreset(absl::GetFlag(FLAGS_model));
    if (!model.ok()) return Fail(model.status());
    costs = AnalyticCostModel(*model, setup->device, setup->analytic);
    model_name = model->name;
  }
  if (!costs.ok()) return Fail(costs.status());
  if (const std::string pool = absl::GetFlag(FLAGS_pool); !pool.empty()) {
    auto jobs = ParsePoolFlags(pool, absl::GetFlag(FLAGS_pool_shares), absl::GetFlag(FLAGS_pool_starts_s));
    if (!jobs.ok()) return Fail(jobs.status());
    return RunPool(*costs, setup->options, *jobs);
  }
  if (const std::string lose = absl::GetFlag(FLAGS_lose_worker); !lose.empty()) {
    auto fault = ParseLostWorkerFlag(lose);
    if (!fault.ok()) return Fail(fault.status());
    const std::string mode = absl::GetFlag(FLAGS_lose_worker_mode);
    if (mode != "sync" && mode != "async") {
      return Fail(absl::InvalidArgumentError("--lose_worker_mode must be sync or async"));
    }
    return RunLostWorker(*costs, setup->options, mode == "sync" ? OptimizerMode::kSync : OptimizerMode::kAsync, *fault);
  }
  const int nodes = absl::GetFlag(FLAGS_nodes);
  if (nodes < 1) return Fail(absl::InvalidArgumentError("--nodes must be >= 1"));
  if (nodes > 1 && !(absl::GetFlag(FLAGS_link_gbps) > 0)) {
    return Fail(absl::InvalidArgumentError("--link_gbps must be > 0"));
  }
  if (nodes > 1 && !(absl::GetFlag(FLAGS_link_efficiency) > 0 && absl::GetFlag(FLAGS_link_efficiency) <= 1)) {
    return Fail(absl::InvalidArgumentError("--link_efficiency must be in (0, 1]"));
  }
  if (nodes > 1) {
    int64_t trainable = 0;
    for (const LayerCost& l : costs->layers) trainable += l.trainable_bytes;
    if (trainable == 0) {
      return Fail(absl::InvalidArgumentError(
          "--nodes: the costs carry no trainable bytes (a profile without byte counts: add --bytes_from_model "
          "--model NAME)"));
    }
  }
  setup->options.sim.optimizer_s_per_layer /= nodes;  // each node steps its shard of the state
  auto rows = CompareSchedules(*costs, setup->options);
  if (!rows.ok()) return Fail(rows.status());

  if (absl::GetFlag(FLAGS_format) == "json") {
    std::printf("%s\n", ComparisonJson(*rows).c_str());
  } else if (absl::GetFlag(FLAGS_format) == "table") {
    std::printf("%s on %s: N=%d, M=%d micro-batches of %lld x %lld tokens, %d layers, per-stage memory cap %.1f GiB\n",
                model_name.c_str(), setup->device.name.c_str(), setup->options.num_workers,
                setup->options.num_microbatches, static_cast<long long>(setup->analytic.micro_batch_size),
                static_cast<long long>(setup->analytic.sequence_length), costs->num_layers(),
                static_cast<double>(setup->options.stage_memory_cap) / (1024.0 * 1024 * 1024));
    std::printf("%s", FormatComparisonTable(*rows).c_str());
    for (const auto& r : *rows) std::printf("  %-22s partition %s\n", r.schedule.c_str(), r.partition.c_str());
    if (absl::GetFlag(FLAGS_explain)) Explain(*costs, *setup);
    if (nodes > 1) PrintCluster(*costs, *setup, *rows, nodes);
  } else {
    return Fail(absl::InvalidArgumentError("--format must be table or json"));
  }

  const std::string pick = absl::GetFlag(FLAGS_gantt_schedule);
  const std::string trace = absl::GetFlag(FLAGS_trace);
  if (absl::GetFlag(FLAGS_gantt) || !trace.empty()) {
    const auto& ids = setup->options.schedules;
    auto it = std::find(ids.begin(), ids.end(), pick);
    if (it == ids.end()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "--gantt/--trace: schedule '", pick, "' is not among --schedule (", absl::StrJoin(ids, ","), ")")));
    }
    const ComparisonRow& row = (*rows)[static_cast<size_t>(it - ids.begin())];
    if (absl::GetFlag(FLAGS_gantt)) {
      std::printf("\n%s (digits: forward stage, *: fused B_1, letters: backward; odd iterations upper-case/#)\n%s",
                  row.schedule.c_str(),
                  GanttChart(row.schedule_data, row.result, absl::GetFlag(FLAGS_gantt_width)).c_str());
    }
    if (!trace.empty()) {
      std::ofstream f(trace);
      f << ChromeTrace(row.schedule_data, row.result);
      if (!f) return Fail(absl::UnavailableError(absl::StrCat("cannot write ", trace)));
      std::fprintf(stderr, "wrote %s\n", trace.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace rp::planning

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "plan and simulate RoundPipe against GPipe, 1F1B, Interleaved 1F1B and Looped BFS.\n"
      "  roundpipe-sim --model qwen3-1.7b --device rtx4090 --gpus 8 --microbatches 16 --schedule all\n"
      "  roundpipe-sim --paper\n"
      "  roundpipe-sim --profile out/profile.json --gpus 4 --microbatches 8\n"
      "  roundpipe-sim --model qwen3-1.7b --pool sync,async --pool_shares 3,1\n"
      "  roundpipe-sim --model qwen3-1.7b --lose_worker 2,3,8\n"
      "  roundpipe-sim --model qwen3-1.7b --nodes 2 --link_gbps 25\n"
      "Exit codes: 0 ok, 2 bad arguments or impossible plan, 1 other errors.");
  absl::ParseCommandLine(argc, argv);
  return rp::planning::Main();
}
