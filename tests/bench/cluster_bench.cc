// cluster_bench — a cluster's gradient exchange on bandwidth-limited links (issue: "Beyond one
// machine"): K nodes of the real engine (controller, dispatch plan, consistency protocol,
// optimizer worker, ZeRO-1 exchange of workers/data_parallel.h) on paced workers, each node's
// communicator processes in a network namespace of their own whose link `tc` shapes
// (tests/bench/cluster_bench.sh builds them). Compute is paced (tests/bench/profiles, scaled by
// --time_scale); the exchange moves real bytes over the shaped links through Gloo, scaled by the
// same factor (DataParallelOptions::meta_wire_scale), so wire time and compute time keep their
// real ratio. Every figure is printed as a real-time equivalent.
//   build/tests/bench/cluster_bench --nodes 2 --netns rpcb --addresses 10.77.0.1,10.77.0.2
//       --wire_counters /sys/class/net/rpcbv0/statistics/rx_bytes,... --link_gbps 1
// Prints per shape (full fine-tune, LoRA) and mode (sync, async): one node alone, the cluster
// node, what cluster_model.h predicts, the collective time per iteration and the share of it
// hidden behind compute, and the bytes each node sent per step (the links' counters) beside the
// design's prediction.
#include <ATen/Parallel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "scheduler/planning/cluster_model.h"
#include "scheduler/planning/presets.h"
#include "scheduler/planning/profile_file.h"
#include "scheduler/runtime/paced_run.h"
#include "tests/support/run_command.h"
#include "workers/store/host_model_store.h"

ABSL_FLAG(std::string, model, "qwen3-1.7b", "Paper model preset with a profile in --profiles_dir");
ABSL_FLAG(std::string, profiles_dir, RP_SOURCE_DIR "/tests/bench/profiles", "Where the profiles are");
ABSL_FLAG(std::string, shapes, "full,lora32", "Shapes: full (every parameter trained) or loraR (rank R adapters)");
ABSL_FLAG(std::string, modes, "sync,async", "Optimizer modes");
ABSL_FLAG(int, nodes, 2, "K");
ABSL_FLAG(int, workers, 8, "N per node");
ABSL_FLAG(int, microbatches, 16, "M per node (each node's share of the global batch)");
ABSL_FLAG(double, time_scale, 0.1, "Wall seconds per real second, for compute and for the bytes exchanged");
ABSL_FLAG(int, iterations, 4, "Measured iterations (after 2 of warm-up)");
ABSL_FLAG(std::string, netns, "", "Namespace prefix: node r's communicators run in <prefix>r (empty: this one)");
ABSL_FLAG(std::string, addresses, "", "Per node, the address its communicators bind (default 127.0.0.1)");
ABSL_FLAG(std::string, wire_counters, "", "Per node, a file counting the bytes it sent (a sysfs statistics file)");
ABSL_FLAG(double, link_gbps, 0, "The links' shaped rate, Gbit/s (for the prediction and the labels)");
ABSL_FLAG(int, buffer_mib, 32, "Each node's gradient buffer shared with its communicator, MiB (one round's data)");
ABSL_FLAG(bool, bf16_gradients, false, "The gradients cross the wire as bf16 (DataParallelOptions::bf16_gradients)");

namespace {

using rp::scheduler::runtime::PacedRunOptions;
using rp::scheduler::runtime::PacedRunResult;

int64_t ReadCounter(const std::string& path) {
  std::ifstream in(path);
  int64_t v = -1;
  in >> v;
  return v;
}

// A shell script that runs the communicator inside namespace `ns` (fds and parent kept: `ip
// netns exec` switches namespace and execs in place).
std::string NamespaceWrapper(const std::string& ns, int rank) {
  const std::string path = absl::StrCat("/tmp/rp-cluster-bench-comm-", ::getpid(), "-", rank, ".sh");
  std::ofstream f(path);
  f << "#!/bin/sh\nexec ip netns exec " << ns << " " << RP_COMM_BINARY << " \"$@\"\n";
  f.close();
  ::chmod(path.c_str(), 0755);
  return path;
}

struct ClusterRun {
  std::vector<PacedRunResult> nodes;
  std::vector<int64_t> sent_bytes;  // per node, from the counters (-1: none given)
};

absl::StatusOr<ClusterRun> RunCluster(const PacedRunOptions& base, int k, const std::string& group) {
  const std::vector<std::string> ns = absl::StrSplit(absl::GetFlag(FLAGS_netns), ',', absl::SkipEmpty());
  const std::vector<std::string> addrs = absl::StrSplit(absl::GetFlag(FLAGS_addresses), ',', absl::SkipEmpty());
  const std::vector<std::string> counters = absl::StrSplit(absl::GetFlag(FLAGS_wire_counters), ',', absl::SkipEmpty());
  rp::spec::InMemoryStore store;
  ClusterRun out;
  out.nodes.resize(static_cast<size_t>(k));
  std::vector<absl::Status> status(static_cast<size_t>(k));
  std::vector<int64_t> before;
  for (int r = 0; r < k; ++r)
    before.push_back(static_cast<size_t>(r) < counters.size() ? ReadCounter(counters[static_cast<size_t>(r)]) : -1);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      PacedRunOptions o = base;
      rp::workers::DataParallelOptions dp;
      dp.rank = r;
      dp.size = k;
      dp.group = group;
      dp.hostname = static_cast<size_t>(r) < addrs.size() ? addrs[static_cast<size_t>(r)] : "127.0.0.1";
      dp.binary = ns.empty() ? std::string(RP_COMM_BINARY) : NamespaceWrapper(absl::StrCat(ns[0], r), r);
      dp.timeout = std::chrono::seconds(120);
      dp.bf16_gradients = absl::GetFlag(FLAGS_bf16_gradients);
      dp.buffer_bytes = int64_t{absl::GetFlag(FLAGS_buffer_mib)} << 20;
      o.data_parallel = dp;
      o.rendezvous = &store;
      auto res = rp::scheduler::runtime::RunPaced(o);
      if (res.ok()) {
        out.nodes[static_cast<size_t>(r)] = *res;
      } else {
        status[static_cast<size_t>(r)] = res.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  for (int r = 0; r < k; ++r) {
    const int64_t now = before[static_cast<size_t>(r)] < 0 ? -1 : ReadCounter(counters[static_cast<size_t>(r)]);
    out.sent_bytes.push_back(now < 0 ? -1 : now - before[static_cast<size_t>(r)]);
  }
  return out;
}

// The shape's model: every parameter trained ("full") or rank-R adapters on the attention and
// MLP projections ("loraR").
absl::StatusOr<rp::spec::ModelConfig> ShapeModel(rp::spec::ModelConfig m, const std::string& shape) {
  if (shape == "full") {
    m.lora.rank = 0;
    return m;
  }
  int rank = 0;
  if (!absl::StartsWith(shape, "lora") || !absl::SimpleAtoi(shape.substr(4), &rank) || rank < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--shapes: '", shape, "' is neither full nor loraR"));
  }
  m.lora.rank = rank;
  m.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return m;
}

// The trainable elements of the shape (what the exchange carries, at full scale).
int64_t TrainableElements(const PacedRunOptions& o) {
  auto pacer = rp::scheduler::runtime::MakePacedClock(o);
  if (!pacer.ok()) return 0;
  auto store = rp::workers::HostModelStore::DataFree(o.model, at::kBFloat16, *pacer);
  int64_t n = 0;
  for (int64_t e : rp::workers::OwnerElements(*store)) n += e;
  return n;
}

absl::Status Row(const rp::planning::Profile& profile, const rp::spec::ModelConfig& model, const std::string& shape,
                 bool async, int row) {
  PacedRunOptions o;
  o.profile = profile;
  o.model = model;
  o.workers = absl::GetFlag(FLAGS_workers);
  o.microbatches = absl::GetFlag(FLAGS_microbatches);
  o.async = async;
  o.time_scale = absl::GetFlag(FLAGS_time_scale);
  o.iterations = absl::GetFlag(FLAGS_iterations);
  auto part = rp::scheduler::runtime::ChoosePacedPartition(o, /*stage_cap_bytes=*/0);
  if (!part.ok()) return part.status();
  o.partition = part->partition;
  o.microbatches_per_round = part->microbatches_per_round;

  auto alone = rp::scheduler::runtime::RunPaced(o);
  if (!alone.ok()) return alone.status();
  const int k = absl::GetFlag(FLAGS_nodes);
  auto cluster = RunCluster(o, k, absl::StrCat("bench-", ::getpid(), "-", row));
  if (!cluster.ok()) return cluster.status();

  const double s = o.time_scale;
  const int64_t elements = TrainableElements(o);
  // The prediction at full scale: the exchange over the link, on top of one node's period.
  rp::planning::CostModel one;
  one.layers.resize(1);
  one.layers[0].trainable_bytes = elements * 2;
  rp::planning::ClusterOptions co;
  co.nodes = k;
  co.link_bytes_per_s = absl::GetFlag(FLAGS_link_gbps) * 1e9 / 8;
  co.link_efficiency = 1;  // the design's figure: the link's full rate
  rp::planning::ClusterPrediction p =
      rp::planning::PredictCluster(one, co, alone->period_s, alone->period_s, /*node_optimizer_s=*/0);
  if (absl::GetFlag(FLAGS_bf16_gradients)) {  // the reduce-scatter's half at 2 bytes per element
    p.wire_bytes_per_node = p.wire_bytes_per_node * 3 / 4;
    p.exchange_s *= 0.75;
    p.sync_iteration_s = alone->period_s + p.exchange_s;
    p.async_iteration_s = std::max(alone->period_s, p.exchange_s);
  }
  double period = 0, coll = 0, sent = 0;
  bool counted = true;
  for (int r = 0; r < k; ++r) {
    const PacedRunResult& n = cluster->nodes[static_cast<size_t>(r)];
    period = std::max(period, n.period_s);
    coll += n.collective_wall_s / s / k;
    counted = counted && cluster->sent_bytes[static_cast<size_t>(r)] >= 0;
    sent += static_cast<double>(cluster->sent_bytes[static_cast<size_t>(r)]) / k;
  }
  const int runs = o.warmup + o.iterations + 1;
  const double sent_real = counted ? sent / runs / s : -1;  // bytes per step per node at full scale
  const double hidden = coll > 0 ? std::clamp(1 - (period - alone->period_s) / coll, 0.0, 1.0) : 0;
  const std::string label = shape + (absl::GetFlag(FLAGS_bf16_gradients) ? "/bf16" : "");
  std::printf("%-11s %-5s %7.2f %9.3f %9.3f %9.3f %10.3f %7.0f%% %11.1f %11.1f %9.3f\n", label.c_str(),
              async ? "async" : "sync", absl::GetFlag(FLAGS_link_gbps), alone->period_s, period,
              async ? p.async_iteration_s : p.sync_iteration_s, coll, 100 * hidden,
              sent_real < 0 ? -1.0 : sent_real / (1 << 20), static_cast<double>(p.wire_bytes_per_node) / (1 << 20),
              sent_real < 0 ? -1.0 : sent_real / static_cast<double>(std::max<int64_t>(1, p.wire_bytes_per_node)));
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  at::set_num_threads(1);
  const std::string model_name = absl::GetFlag(FLAGS_model);
  auto profile = rp::planning::ParseProfile(
      rp::testing::ReadWholeFile(absl::GetFlag(FLAGS_profiles_dir) + "/" + model_name + ".json"));
  auto preset = rp::planning::ModelPreset(model_name);
  if (!profile.ok() || !preset.ok()) {
    std::fprintf(stderr, "%s: no profile or preset\n", model_name.c_str());
    return 1;
  }
  std::printf(
      "cluster of %d nodes x %d paced workers, %s, M=%d per node, time scale %.3f (figures: real-time "
      "equivalents; the links' bytes scaled back)\n",
      absl::GetFlag(FLAGS_nodes), absl::GetFlag(FLAGS_workers), model_name.c_str(), absl::GetFlag(FLAGS_microbatches),
      absl::GetFlag(FLAGS_time_scale));
  std::printf("%-11s %-5s %7s %9s %9s %9s %10s %8s %11s %11s %9s\n", "shape", "mode", "Gbit/s", "alone s", "node s",
              "predict s", "collect s", "hidden", "sent MiB", "design MiB", "ratio");
  int row = 0;
  for (const std::string& shape :
       std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty()))) {
    auto model = ShapeModel(*preset, shape);
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
      return 1;
    }
    for (const std::string& mode :
         std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty()))) {
      if (absl::Status st = Row(*profile, *model, shape, mode == "async", row++); !st.ok()) {
        std::fprintf(stderr, "%s %s: %s\n", shape.c_str(), mode.c_str(), std::string(st.message()).c_str());
        return 1;
      }
    }
  }
  return 0;
}
