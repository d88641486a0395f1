// The paper's §5.8.1 claims, reproduced with the analytic RTX 4090 cost model: 8 GPUs, 16
// micro-batches of 4 x 2048 tokens, the five preset models.
#include "scheduler/planning/comparison.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/presets.h"
#include "scheduler/planning/profile_file.h"
#include "scheduler/planning/report.h"

namespace rp::planning {
namespace {

TEST(Section581, RoundPipeBeatsEveryBaselineOnThePapersModels) {
  const DeviceProfile dev = *DevicePreset("rtx4090");
  for (const std::string& name : PaperModelPresetNames()) {
    auto costs = AnalyticCostModel(*ModelPreset(name), dev, {});
    ASSERT_TRUE(costs.ok()) << costs.status();
    ComparisonOptions o;
    o.stage_memory_cap = (dev.memory_bytes - (int64_t{2} << 30)) / 2;
    auto rows = CompareSchedules(*costs, o);
    ASSERT_TRUE(rows.ok()) << name << ": " << rows.status();
    ASSERT_EQ(rows->size(), 6u);
    const ComparisonRow& sync = (*rows)[4];
    const ComparisonRow& async = (*rows)[5];
    ASSERT_EQ(sync.schedule, "RoundPipe-sync");
    ASSERT_EQ(async.schedule, "RoundPipe-async");
    // Paper: RoundPipe-sync has fewer bubbles than every baseline; async removes the
    // iteration-boundary (fill/drain) bubbles — with at least N slots per round (the simulated
    // choice may take fewer when that simulates better: then some workers idle in every round
    // even with balanced stages, and the total is what it wins on). What remains at the
    // boundary is how unequal slots pack across it (Llama-3.1-8B's 14 slots: 0.29 %; sync
    // pays 14.3 % in all).
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_LT(sync.bubbles.total, (*rows)[i].bubbles.total) << name << " vs " << (*rows)[i].schedule;
    }
    EXPECT_LT(async.bubbles.total, sync.bubbles.total) << name;
    EXPECT_LT(async.bubbles.total, 0.045) << name << ": the paper's RoundPipe-async bound";
    if (async.stages >= o.num_workers) {
      EXPECT_LT(async.bubbles.fill_drain, 0.005) << name;
    }
    // The simulated choice is never worse than the paper's objective alone.
    ComparisonOptions paper = o;
    paper.partition_by_simulation = false;
    paper.schedules = {"roundpipe-sync", "roundpipe-async"};
    auto by_objective = CompareSchedules(*costs, paper);
    ASSERT_TRUE(by_objective.ok());
    EXPECT_LE(sync.bubbles.period_s, (*by_objective)[0].bubbles.period_s * (1 + 1e-9)) << name;
    EXPECT_LE(async.bubbles.period_s, (*by_objective)[1].bubbles.period_s * (1 + 1e-9)) << name;
    EXPECT_LT(async.bubbles.period_s, sync.bubbles.period_s) << name;
    // The table renders every row, and steady-state zeros as 0.00, never -0.00.
    const std::string table = FormatComparisonTable(*rows);
    for (const auto& r : *rows) EXPECT_NE(table.find(r.schedule), std::string::npos);
    EXPECT_EQ(table.find("-0.00"), std::string::npos) << table;
  }
}

// The MoE presets (the paper's two and Qwen3-30B-A3B): a sparse block's upload is all of its
// experts (bf16), and the partitions RoundPipe picks in both modes keep every slot's memory —
// those weights included — within the cap, which a stage of three sparse 235B blocks would not.
TEST(Section581, MoePresetsArePartitionedWithinTheMemoryCapCountingEveryExpert) {
  const DeviceProfile dev = *DevicePreset("rtx4090");
  const int64_t cap = (dev.memory_bytes - (int64_t{2} << 30)) / 2;
  for (const char* name : {"qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b"}) {
    const spec::ModelConfig m = *ModelPreset(name);
    auto costs = AnalyticCostModel(m, dev, {});
    ASSERT_TRUE(costs.ok()) << name << ": " << costs.status();
    const int64_t experts_bytes = 2 * int64_t{m.num_experts} * 3 * m.hidden * m.expert_intermediate;
    EXPECT_GE(costs->layers[1].param_bytes, experts_bytes) << name;
    for (OptimizerMode mode : {OptimizerMode::kSync, OptimizerMode::kAsync}) {
      PartitionProblem pr{&*costs, 8, 16, cap};
      auto best = SimulatedBestPartition(pr, SimulatedChoice{.mode = mode});
      ASSERT_TRUE(best.ok()) << name << ": " << best.status();
      for (const StageShape& st : DescribeStages(best->partition, *costs)) {
        EXPECT_LE(st.memory_bytes, cap) << name << " " << best->partition.ToString();
      }
    }
  }
  const spec::ModelConfig big = *ModelPreset("qwen3-235b-a22b");
  const auto costs = *AnalyticCostModel(big, dev, {});
  EXPECT_GT(costs.ForwardMemory(1) + costs.ForwardMemory(2) + costs.ForwardMemory(3), cap);  // the cap binds
}

// The authors' knobs reach RoundPipe's automatic partition through CompareSchedules (and so
// roundpipe-sim): min_stages is a floor on the slots of both modes' choice, the window an upper
// bound on their t_max, and the baselines do not change.
TEST(CompareSchedules, MinStagesAndTmaxWindowSteerTheAutomaticPartition) {
  const DeviceProfile dev = *DevicePreset("rtx4090");
  auto costs = AnalyticCostModel(*ModelPreset("qwen3-1.7b"), dev, {});
  ASSERT_TRUE(costs.ok());
  ComparisonOptions o;
  o.stage_memory_cap = (dev.memory_bytes - (int64_t{2} << 30)) / 2;
  o.schedules = {"1f1b", "roundpipe-sync", "roundpipe-async"};
  auto free = *CompareSchedules(*costs, o);
  o.min_stages = 24;
  auto floor = *CompareSchedules(*costs, o);
  EXPECT_LT(free[1].stages, 24);  // else the knob would show nothing
  EXPECT_GE(floor[1].stages, 24);
  EXPECT_GE(floor[2].stages, 24);
  EXPECT_EQ(floor[0].partition, free[0].partition);
  o.min_stages = 0;
  o.t_max_window = 1.0;
  PartitionProblem pr{&*costs, o.num_workers, o.num_microbatches, o.stage_memory_cap};
  const double w = *MinimumTmax(pr);
  auto tight = *CompareSchedules(*costs, o);
  EXPECT_GT(free[2].t_max_s, w * 1.2);  // unconstrained, the async choice sits well above W
  EXPECT_NEAR(tight[1].t_max_s, w, 1e-12);
  EXPECT_NEAR(tight[2].t_max_s, w, 1e-12);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// On the paper's five models (the authors' per-layer figures, tests/bench/profiles), the
// automatic choice is never slower than the authors' rule — the t_max window [W, 1.1 W] — nor than
// the paper's objective, nor than its own simulated choice confined to that window, in either
// mode; RoundPipe-sync is below every baseline and RoundPipe-async below 4.5 %.
TEST(Section581, TheAutomaticChoiceIsNeverSlowerThanTheAuthorsWindowOnTheirFigures) {
  for (const char* model : {"qwen3-1.7b", "llama-3.1-8b", "gpt-oss-20b", "qwen3-32b", "qwen3-235b-a22b"}) {
    auto prof = ParseProfile(ReadFile(std::string(RP_PROFILES_DIR) + "/" + model + ".json"));
    ASSERT_TRUE(prof.ok()) << model << ": " << prof.status();
    ComparisonOptions o;
    o.schedules = {"roundpipe-sync", "roundpipe-async"};
    auto ours = CompareSchedules(prof->costs, o);
    ASSERT_TRUE(ours.ok()) << ours.status();
    ComparisonOptions theirs = o;
    theirs.t_max_window = 1.1;
    theirs.partition_by_simulation = false;
    ComparisonOptions objective = o;
    objective.partition_by_simulation = false;
    // Our simulated choice confined to their window: the near-minimum candidates make the
    // unconfined choice at least as good (Qwen3-1.7B sync: 18.30 % without them, 15.70 % with).
    ComparisonOptions windowed = o;
    windowed.t_max_window = 1.1;
    for (const ComparisonOptions* other : {&theirs, &objective, &windowed}) {
      auto rows = CompareSchedules(prof->costs, *other);
      ASSERT_TRUE(rows.ok()) << rows.status();
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_LE((*ours)[i].bubbles.period_s, (*rows)[i].bubbles.period_s * (1 + 1e-9))
            << model << " " << (*ours)[i].schedule << ": ours " << (*ours)[i].partition << ", other "
            << (*rows)[i].partition;
      }
    }
    EXPECT_LT((*ours)[1].bubbles.total, 0.045) << model;
    EXPECT_EQ(FormatComparisonTable(*ours).find("-0.00"), std::string::npos) << FormatComparisonTable(*ours);
    ComparisonOptions baselines = o;
    baselines.schedules = {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs"};
    auto base = CompareSchedules(prof->costs, baselines);
    ASSERT_TRUE(base.ok()) << base.status();
    for (const ComparisonRow& b : *base) {
      EXPECT_LT((*ours)[0].bubbles.total, b.bubbles.total) << model << " vs " << b.schedule;
    }
  }
}

// The round size chosen with the partition (the authors' simulator runs rounds of N): never
// slower than one round, at least 1.5 % faster in sync mode on Llama-3.1-8B and GPT-OSS-20B with
// M_R = 8, and the row runs the pair it reports.
TEST(Section581, ChoosingTheRoundSizeIsNeverSlowerAndPicksRoundsOfNWhereTheyWin) {
  for (const char* model : {"qwen3-1.7b", "llama-3.1-8b", "gpt-oss-20b", "qwen3-32b", "qwen3-235b-a22b"}) {
    auto prof = ParseProfile(ReadFile(std::string(RP_PROFILES_DIR) + "/" + model + ".json"));
    ASSERT_TRUE(prof.ok()) << model << ": " << prof.status();
    ComparisonOptions one;
    one.schedules = {"roundpipe-sync", "roundpipe-async"};
    ComparisonOptions chosen = one;
    chosen.choose_round_size = true;
    auto a = CompareSchedules(prof->costs, one);
    auto b = CompareSchedules(prof->costs, chosen);
    ASSERT_TRUE(a.ok() && b.ok());
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_LE((*b)[i].bubbles.period_s, (*a)[i].bubbles.period_s * (1 + 1e-9)) << model << " " << (*b)[i].schedule;
      EXPECT_NE((*b)[i].partition.find(" M_R="), std::string::npos) << (*b)[i].partition;
    }
    const std::string sync = (*b)[0].partition;
    if (std::string(model) == "llama-3.1-8b" || std::string(model) == "gpt-oss-20b") {
      EXPECT_NE(sync.find(" M_R=8"), std::string::npos) << model << ": " << sync;
      EXPECT_LT((*b)[0].bubbles.period_s, (*a)[0].bubbles.period_s * 0.985) << model;
      // The chosen pair, simulated as a user partition with a fixed round size, gives the same
      // period.
      PartitionProblem pr{&prof->costs, one.num_workers, one.num_microbatches, one.stage_memory_cap};
      SimulatedChoice choice;
      choice.choose_round_size = true;
      auto picked = SimulatedBestPartition(pr, choice);
      ASSERT_TRUE(picked.ok()) << picked.status();
      EXPECT_EQ(picked->microbatches_per_round, 8) << model;
      EXPECT_EQ(absl::StrCat(picked->partition.ToString(), " M_R=8"), sync) << model;
      ComparisonOptions fixed = one;
      fixed.schedules = {"roundpipe-sync"};
      fixed.microbatches_per_round = picked->microbatches_per_round;
      fixed.user_partition = picked->partition;
      auto c = CompareSchedules(prof->costs, fixed);
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_NEAR((*c)[0].bubbles.period_s, (*b)[0].bubbles.period_s, 1e-9) << model;
    }
  }
}

// What the authors' simulator allows that hardware cannot: with backward stages' recompute and
// B_1's head forward started before their inputs (an ablation flag) and only activation hops
// charged, as in their simulator, GPT-OSS-20B's sync iteration drops to their 7282.8 ms (within
// 0.5 %); with the real dependencies no candidate reaches it (7366.9 ms).
TEST(Section581, StartsBeforeInputsAreWhatTheAuthorsGptOssMakespanNeeds) {
  auto prof = ParseProfile(ReadFile(std::string(RP_PROFILES_DIR) + "/gpt-oss-20b.json"));
  ASSERT_TRUE(prof.ok()) << prof.status();
  ComparisonOptions o;
  o.schedules = {"roundpipe-sync"};
  o.choose_round_size = true;
  o.sim.transfers = true;
  o.sim.weight_transfers = false;
  o.sim.host_link_bandwidth = 32e9;
  o.sim.activation_hop_s = prof->activation_hop_s;
  auto real = CompareSchedules(prof->costs, o);
  ASSERT_TRUE(real.ok()) << real.status();
  o.sim.early_starts_before_inputs = true;
  auto theirs = CompareSchedules(prof->costs, o);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  constexpr double kAuthorsMakespan = 7.2828;
  EXPECT_GT((*real)[0].bubbles.period_s, kAuthorsMakespan * 1.005) << (*real)[0].partition;
  EXPECT_NEAR((*theirs)[0].bubbles.period_s / kAuthorsMakespan, 1.0, 0.005) << (*theirs)[0].partition;
  EXPECT_LT((*theirs)[0].bubbles.period_s, (*real)[0].bubbles.period_s);
}

TEST(CompareSchedules, UnknownScheduleIsAnError) {
  CostModel c = SyntheticCostModel(10, 2);
  ComparisonOptions o;
  o.num_workers = 2;
  o.num_microbatches = 4;
  o.schedules = {"zero-bubble"};
  auto rows = CompareSchedules(c, o);
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("unknown schedule 'zero-bubble'"), std::string::npos);
}

TEST(Report, GanttAndTraceShowEveryWorker) {
  CostModel c = SyntheticCostModel(10, 2);
  ComparisonOptions o;
  o.num_workers = 3;
  o.num_microbatches = 6;
  o.iterations = 2;
  o.schedules = {"roundpipe-async"};
  auto rows = *CompareSchedules(c, o);
  const std::string g = GanttChart(rows[0].schedule_data, rows[0].result, 60);
  EXPECT_NE(g.find("gpu0"), std::string::npos);
  EXPECT_NE(g.find("gpu2"), std::string::npos);
  EXPECT_NE(g.find('*'), std::string::npos);  // the fused stage, iteration 0
  EXPECT_NE(g.find('#'), std::string::npos);  // the fused stage, iteration 1
  const std::string trace = ChromeTrace(rows[0].schedule_data, rows[0].result);
  EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(trace.find("\"ph\":\"X\""), std::string::npos);
  const std::string json = ComparisonJson(rows);
  EXPECT_NE(json.find("\"bubble_ratio\""), std::string::npos);
}

}  // namespace
}  // namespace rp::planning
