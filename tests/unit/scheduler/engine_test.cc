#include "scheduler/engine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "nlohmann/json.hpp"
#include "scheduler/job_files.h"
#include "scheduler/planning/model_config.h"
#include "scheduler/runtime/engine_impl.h"
#include "scheduler/runtime/model_adapter.h"
#include "tests/support/engine_values.h"
#include "tests/support/oracle_cache.h"
#include "tests/support/reference_model.h"
#include "tests/support/run_command.h"
#include "tests/support/tokens.h"
#include "workers/io/checkpoint.h"
#include "workers/io/safetensors_reader.h"

namespace rp::scheduler {
namespace {

using namespace std::chrono_literals;

JobSpec TinyJob() {
  JobSpec s;
  s.name = "tiny";
  s.model.family = "qwen3";
  s.model.vocab = 41;
  s.model.hidden = 16;
  s.model.intermediate = 24;
  s.model.num_blocks = 3;
  s.model.num_heads = 2;
  s.model.num_kv_heads = 1;
  s.model.head_dim = 8;
  s.model.qk_norm = true;
  s.seed = 4;
  s.optimizer.lr = 1e-3;
  s.optimizer.eps = 1e-6;
  return s;
}

using rp::testing::RandomTokens;

std::vector<JobEvent> DrainUntilEnded(Engine& e, JobId id) {
  std::vector<JobEvent> all;
  for (int i = 0; i < 600; ++i) {
    auto ev = e.AwaitEvents(id, 100ms);
    EXPECT_TRUE(ev.ok());
    for (auto& x : *ev) all.push_back(x);
    auto st = e.State(id);
    if (*st != JobState::kQueued && *st != JobState::kRunning) {
      auto rest = e.AwaitEvents(id, 0ms);
      for (auto& x : *rest) all.push_back(x);
      return all;
    }
  }
  ADD_FAILURE() << "job did not end";
  return all;
}

TEST(Engine, TrainsAJobAndMatchesTheReference) {
  auto engine = Engine::Create({"cpu:3"});
  ASSERT_TRUE(engine.ok()) << engine.status();
  JobSpec spec = TinyJob();
  spec.microbatches = 3;
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  // The reference starts from the same initial weights.
  workers::HostModelStore init(rp::testing::ConfigOf(spec.model), at::kFloat, spec.seed);
  rp::testing::ReferenceModel ref(init, runtime::ToAdamW(spec.optimizer));
  std::vector<double> want;
  for (int it = 0; it < 3; ++it) {
    at::Tensor t = RandomTokens(6, 8, spec.model.vocab, 50 + it);
    want.push_back(ref.Step(t));
    ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(t)).ok());
  }
  ASSERT_TRUE((*engine)->CloseInput(*id).ok());
  auto events = DrainUntilEnded(**engine, *id);
  std::vector<double> got;
  std::vector<JobState> states;
  for (const auto& e : events) {
    if (e.kind == JobEvent::Kind::kIteration) got.push_back(e.stats.loss);
    if (e.kind == JobEvent::Kind::kState) states.push_back(e.state);
  }
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]);
  EXPECT_EQ(states, (std::vector<JobState>{JobState::kQueued, JobState::kRunning, JobState::kSucceeded}));
  auto w = (*engine)->Parameter(*id, "model.layers.1.mlp.down_proj.weight");
  ASSERT_TRUE(w.ok());
  EXPECT_LT(rp::testing::RelativeError(rp::testing::ToTensor(*w), ref.param("model.layers.1.mlp.down_proj.weight")),
            1e-5);
  EXPECT_FALSE((*engine)->Parameter(*id, "nope").ok());
  EXPECT_EQ((*engine)->Stats().devices.size(), 3u);
}

// The qwen3-moe-tiny preset (8 experts, top-2, every block sparse) trains in the async engine
// on three workers: a repeated batch's loss falls. With the router's auxiliary loss on (coef
// 0.5), the first step's loss — same seed, same weights — exceeds the cross-entropy alone by
// coef · aux, and aux is near k = 2 for a fresh router (near-uniform probabilities).
std::vector<double> MoeTinyLosses(double aux_coef, const char* preset = "qwen3-moe-tiny") {
  auto engine = Engine::Create({"cpu:3"});
  EXPECT_TRUE(engine.ok()) << engine.status();
  JobSpec spec;
  spec.model = *planning::ModelPreset(preset);
  spec.model.router_aux_loss_coef = aux_coef;
  spec.precision = Precision::kFloat32;
  spec.optimizer.lr = 3e-3;
  spec.microbatches = 3;
  auto id = (*engine)->Submit(spec);
  EXPECT_TRUE(id.ok()) << id.status();
  const at::Tensor t = RandomTokens(3, 32, spec.model.vocab, 8);
  for (int it = 0; it < 12; ++it) EXPECT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(t)).ok());
  EXPECT_TRUE((*engine)->CloseInput(*id).ok());
  std::vector<double> losses;
  for (const auto& e : DrainUntilEnded(**engine, *id)) {
    if (e.kind == JobEvent::Kind::kIteration) losses.push_back(e.stats.loss);
  }
  return losses;
}

TEST(Engine, TheQwen3MoeTinyPresetLearnsWithAndWithoutItsRouterAuxLoss) {
  const std::vector<double> plain = MoeTinyLosses(0), with_aux = MoeTinyLosses(0.5);
  ASSERT_EQ(plain.size(), 12u);
  ASSERT_EQ(with_aux.size(), 12u);
  EXPECT_LT(plain.back(), 0.8 * plain.front());
  EXPECT_LT(with_aux.back(), 0.8 * with_aux.front());
  EXPECT_NEAR(with_aux[0] - plain[0], 0.5 * 2, 0.1);
}

// GPT-OSS's tiny preset (sliding blocks of a 16-token window over 32-token sequences, sinks,
// YaRN, biases, clamped SwiGLU) the same way.
TEST(Engine, TheGptOssTinyPresetLearnsWithAndWithoutItsRouterAuxLoss) {
  const std::vector<double> plain = MoeTinyLosses(0, "gpt-oss-tiny"), with_aux = MoeTinyLosses(0.5, "gpt-oss-tiny");
  ASSERT_EQ(plain.size(), 12u);
  ASSERT_EQ(with_aux.size(), 12u);
  EXPECT_LT(plain.back(), 0.8 * plain.front());
  EXPECT_LT(with_aux.back(), 0.8 * with_aux.front());
  EXPECT_NEAR(with_aux[0] - plain[0], 0.5 * 2, 0.1);
}

TEST(Engine, BadInputGetsClearErrorsAndTheJobKeepsRunning) {
  auto engine = *Engine::Create({"cpu:2"});
  JobSpec bad = TinyJob();
  bad.model.num_kv_heads = 3;
  EXPECT_EQ(engine->Submit(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = TinyJob();
  bad.partition = planning::Partition{{1}, 1, {1}};  // covers 2 of 5 layers
  EXPECT_FALSE(engine->Submit(bad).ok());
  bad = TinyJob();
  bad.microbatches = 1;  // fewer than 2 workers per round
  EXPECT_FALSE(engine->Submit(bad).ok());
  EXPECT_FALSE(Engine::Create({"tpu:1"}).ok());

  JobSpec spec = TinyJob();
  spec.max_steps = 2;
  auto id = *engine->Submit(spec);
  const int64_t V = spec.model.vocab;
  auto fb = [&](at::Tensor t) { return engine->FeedBatch(id, rp::testing::ToBatch(std::move(t))); };
  Batch torn = rp::testing::ToBatch(RandomTokens(4, 8, V, 1));
  torn.tokens.pop_back();  // fewer ids than rows x cols
  EXPECT_EQ(engine->FeedBatch(id, torn).code(), absl::StatusCode::kInvalidArgument);
  Batch bad_labels = rp::testing::ToBatch(RandomTokens(4, 8, V, 1));
  bad_labels.labels.assign(32, static_cast<int32_t>(V));  // a target outside the vocabulary
  EXPECT_EQ(engine->FeedBatch(id, bad_labels).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fb(at::full({4, 8}, V, at::kLong)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fb(at::zeros({3, 8}, at::kLong)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fb(at::zeros({0, 8}, at::kLong)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->FeedBatch(999, rp::testing::ToBatch(RandomTokens(4, 8, V, 1))).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(fb(RandomTokens(4, 8, V, 1)).ok());
  ASSERT_TRUE(fb(RandomTokens(4, 8, V, 2)).ok());
  auto events = DrainUntilEnded(*engine, id);
  int iterations = 0;
  for (const auto& e : events) iterations += e.kind == JobEvent::Kind::kIteration;
  EXPECT_EQ(iterations, 2);
  EXPECT_EQ(*engine->State(id), JobState::kSucceeded);  // max_steps reached
  EXPECT_EQ(fb(RandomTokens(4, 8, V, 3)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Engine, BackpressureCancelAndQueueing) {
  auto engine = *Engine::Create({"cpu:1"});
  JobSpec spec = TinyJob();
  spec.max_queued_batches = 1;
  auto first = *engine->Submit(spec);
  auto second = *engine->Submit(spec);  // waits until the first ends
  EXPECT_EQ(*engine->State(second), JobState::kQueued);
  // Fill the first job's queue; with no consumer progress guarantee, a tiny timeout must
  // eventually report a full queue rather than block forever.
  const int64_t V = spec.model.vocab;
  int deadline_hits = 0;
  for (int i = 0; i < 20 && deadline_hits == 0; ++i) {
    absl::Status st = engine->FeedBatch(first, rp::testing::ToBatch(RandomTokens(64, 64, V, i)), 0ms);
    if (st.code() == absl::StatusCode::kDeadlineExceeded)
      ++deadline_hits;
    else
      EXPECT_TRUE(st.ok()) << st;
  }
  EXPECT_EQ(deadline_hits, 1);
  ASSERT_TRUE(engine->Cancel(second).ok());
  EXPECT_EQ(*engine->State(second), JobState::kCancelled);
  ASSERT_TRUE(engine->Cancel(first).ok());
  DrainUntilEnded(*engine, first);
  EXPECT_EQ(*engine->State(first), JobState::kCancelled);
  EXPECT_EQ(engine->Cancel(first).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->Cancel(12345).code(), absl::StatusCode::kNotFound);
  engine->Shutdown();
  EXPECT_EQ(engine->Submit(spec).status().code(), absl::StatusCode::kUnavailable);
}

TEST(Engine, AsyncJobMatchesTheStaleness1Reference) {
  auto engine = *Engine::Create({"cpu:2"});
  JobSpec spec = TinyJob();
  spec.microbatches = 2;
  spec.optimizer_mode = planning::OptimizerMode::kAsync;
  spec.max_queued_batches = 8;
  workers::HostModelStore init(rp::testing::ConfigOf(spec.model), at::kFloat, spec.seed);
  rp::testing::ReferenceModel ref(init, runtime::ToAdamW(spec.optimizer));
  auto id = *engine->Submit(spec);
  std::vector<double> want;
  for (int it = 0; it < 5; ++it) {
    at::Tensor t = RandomTokens(4, 8, spec.model.vocab, 70 + it);
    want.push_back(ref.StaleStep(t));
    ASSERT_TRUE(engine->FeedBatch(id, rp::testing::ToBatch(t)).ok());
  }
  ASSERT_TRUE(engine->CloseInput(id).ok());
  std::vector<double> got;
  for (const auto& e : DrainUntilEnded(*engine, id)) {
    if (e.kind == JobEvent::Kind::kIteration) got.push_back(e.stats.loss);
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << i;
  EXPECT_EQ(*engine->State(id), JobState::kSucceeded);
  // After the job ended the store holds every step (the engine flushed the optimizer).
  for (const auto& [name, w] : ref.params()) {
    auto p = engine->Parameter(id, name);
    ASSERT_TRUE(p.ok());
    EXPECT_LT(rp::testing::RelativeError(rp::testing::ToTensor(*p), w), 1e-5) << name;
  }
}

TEST(Engine, AutoPartitionedJobPlansFromMeasuredTimesAndReportsIt) {
  auto engine = *Engine::Create({"cpu:2"});
  JobSpec spec = TinyJob();
  spec.model.vocab = 2000;  // a heavy head
  spec.microbatches = 2;
  spec.auto_partition = true;
  spec.max_steps = 6;
  auto id = engine->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  for (int it = 0; it < 6; ++it)
    ASSERT_TRUE(engine->FeedBatch(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, it))).ok());
  std::vector<IterationStats> stats;
  for (const auto& e : DrainUntilEnded(*engine, *id)) {
    if (e.kind == JobEvent::Kind::kIteration) stats.push_back(e.stats);
  }
  ASSERT_EQ(stats.size(), 6u);
  EXPECT_EQ(stats[0].partition, "F[1,1,1,1] B1=1 B[1,1,1,1]");  // profiling: one layer per slot
  EXPECT_EQ(stats[0].predicted_bubble, 0);                      // nothing planned yet
  // Planned from the measured times (the simulated choice may keep one layer per slot when that
  // simulates best): the planner's partition and its predicted bubble are reported.
  EXPECT_TRUE(stats[5].partition_problem.empty()) << stats[5].partition_problem;
  EXPECT_GT(stats[5].predicted_bubble, 0) << stats[5].partition;
}

TEST(Engine, ShutdownWithARunningAsyncJobCancelsItCleanly) {
  auto engine = *Engine::Create({"cpu:2"});
  JobSpec spec = TinyJob();
  spec.microbatches = 2;
  spec.optimizer_mode = planning::OptimizerMode::kAsync;
  spec.max_queued_batches = 16;
  auto id = *engine->Submit(spec);
  for (int it = 0; it < 10; ++it)
    ASSERT_TRUE(engine->FeedBatch(id, rp::testing::ToBatch(RandomTokens(64, 32, spec.model.vocab, it))).ok());
  // Wait (on events, not a sleep) until the first iteration has run.
  bool ran = false;
  for (int i = 0; i < 100 && !ran; ++i) {
    auto events = engine->AwaitEvents(id, 100ms);  // keep the StatusOr alive while iterating
    ASSERT_TRUE(events.ok());
    for (const auto& e : *events) ran |= e.kind == JobEvent::Kind::kIteration;
  }
  ASSERT_TRUE(ran);
  engine->Shutdown();
  const JobState s = *engine->State(id);
  EXPECT_TRUE(s == JobState::kCancelled || s == JobState::kSucceeded) << JobStateName(s);
  EXPECT_EQ(engine->FeedBatch(id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 1))).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Engine, DefaultPartitionComesFromTheParameterSizes) {
  JobSpec spec = TinyJob();
  auto p = PlanFromParameterSizes(spec.model, 2, 4);
  ASSERT_TRUE(p.ok()) << p.status();
  int fwd = p->fused, bwd = p->fused;
  for (int n : p->forward) fwd += n;
  for (int n : p->backward) bwd += n;
  EXPECT_EQ(fwd, spec.model.num_layers());
  EXPECT_EQ(bwd, spec.model.num_layers());
}

}  // namespace
}  // namespace rp::scheduler

namespace rp::scheduler {
namespace {

// Waits (on the engine's own notification) until job `id` reports state `want`; the events it
// consumes meanwhile are appended to `seen` when given.
bool AwaitState(Engine& e, JobId id, JobState want, std::vector<JobEvent>* seen = nullptr) {
  for (int i = 0; i < 300; ++i) {
    if (*e.State(id) == want) return true;
    auto ev = e.AwaitEvents(id, 100ms);
    if (!ev.ok()) return false;
    bool reached = false;
    for (const auto& x : *ev) {
      if (seen) seen->push_back(x);
      reached |= x.kind == JobEvent::Kind::kState && x.state == want;
    }
    if (reached) return true;
  }
  return *e.State(id) == want;
}

TEST(Engine, PauseHoldsARunningJobBetweenIterationsAndResumeContinuesExactly) {
  for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
    auto engine = Engine::Create({"cpu:2"});
    ASSERT_TRUE(engine.ok());
    JobSpec spec = TinyJob();
    spec.optimizer_mode = mode;
    auto id = (*engine)->Submit(spec);
    ASSERT_TRUE(id.ok());
    workers::HostModelStore init(rp::testing::ConfigOf(spec.model), at::kFloat, spec.seed);
    rp::testing::ReferenceModel ref(init, runtime::ToAdamW(spec.optimizer));
    std::vector<at::Tensor> data;
    for (int it = 0; it < 4; ++it) data.push_back(RandomTokens(4, 8, spec.model.vocab, 70 + it));
    ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(data[0])).ok());
    ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(data[1])).ok());
    std::vector<JobEvent> events;  // every event of the job, in order
    // Running first: a job paused before the runner takes it is never built (no weights yet).
    ASSERT_TRUE(AwaitState(**engine, *id, JobState::kRunning, &events));
    ASSERT_TRUE((*engine)->Pause(*id).ok());
    ASSERT_TRUE(AwaitState(**engine, *id, JobState::kPaused, &events));
    // Paused: batches queue up but nothing runs; the optimizer is flushed, so the weights are
    // those of a whole number of steps and stay put.
    ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(data[2])).ok());
    auto w1 = (*engine)->Parameter(*id, "model.layers.1.mlp.down_proj.weight");
    std::this_thread::sleep_for(50ms);
    auto w2 = (*engine)->Parameter(*id, "model.layers.1.mlp.down_proj.weight");
    EXPECT_EQ(w1->data, w2->data);
    EXPECT_EQ(*(*engine)->State(*id), JobState::kPaused);
    ASSERT_TRUE((*engine)->Resume(*id).ok());
    // The runner leaves the pause asynchronously: until it does the job still reads PAUSED, which
    // DrainUntilEnded would take for the end (seen under TSAN).
    ASSERT_TRUE(AwaitState(**engine, *id, JobState::kRunning, &events));
    ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(data[3])).ok());
    ASSERT_TRUE((*engine)->CloseInput(*id).ok());
    for (auto& e : DrainUntilEnded(**engine, *id)) events.push_back(e);
    std::vector<double> losses;
    std::vector<JobState> states;
    for (const auto& e : events) {
      if (e.kind == JobEvent::Kind::kIteration) losses.push_back(e.stats.loss);
      if (e.kind == JobEvent::Kind::kState) states.push_back(e.state);
    }
    EXPECT_EQ(*(*engine)->State(*id), JobState::kSucceeded);
    ASSERT_EQ(losses.size(), 4u);
    EXPECT_TRUE(std::find(states.begin(), states.end(), JobState::kPaused) != states.end());
    // Sync training is unaffected by the pause; async flushes at the pause (a sync point), so
    // the reference takes a synchronous step there.
    if (mode == planning::OptimizerMode::kSync) {
      for (int it = 0; it < 4; ++it) EXPECT_NEAR(losses[it], ref.Step(data[it]), 1e-5);
    }
    EXPECT_EQ(states.back(), JobState::kSucceeded);
  }
}

TEST(Engine, HigherPriorityRunsFirstAndAPausedQueuedJobWaits) {
  auto engine = Engine::Create({"cpu:1"});
  ASSERT_TRUE(engine.ok());
  JobSpec blocker = TinyJob();
  auto first = (*engine)->Submit(blocker);  // takes the runner and waits for input
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(AwaitState(**engine, *first, JobState::kRunning));
  JobSpec low = TinyJob(), high = TinyJob(), held = TinyJob();
  low.priority = 0;
  high.priority = 5;
  held.priority = 9;
  auto lo = (*engine)->Submit(low);
  auto hi = (*engine)->Submit(high);
  auto hd = (*engine)->Submit(held);
  ASSERT_TRUE(lo.ok() && hi.ok() && hd.ok());
  ASSERT_TRUE((*engine)->Pause(*hd).ok());
  EXPECT_EQ(*(*engine)->State(*hd), JobState::kPaused);
  ASSERT_TRUE((*engine)->CloseInput(*first).ok());
  // The high-priority job starts next although it was submitted later; the held one waits.
  ASSERT_TRUE(AwaitState(**engine, *hi, JobState::kRunning));
  EXPECT_EQ(*(*engine)->State(*lo), JobState::kQueued);
  EXPECT_EQ(*(*engine)->State(*hd), JobState::kPaused);
  ASSERT_TRUE((*engine)->CloseInput(*hi).ok());
  ASSERT_TRUE(AwaitState(**engine, *lo, JobState::kRunning));
  ASSERT_TRUE((*engine)->CloseInput(*lo).ok());
  ASSERT_TRUE(AwaitState(**engine, *lo, JobState::kSucceeded));
  EXPECT_EQ(*(*engine)->State(*hd), JobState::kPaused);
  ASSERT_TRUE((*engine)->Resume(*hd).ok());
  ASSERT_TRUE(AwaitState(**engine, *hd, JobState::kRunning));
  ASSERT_TRUE((*engine)->Cancel(*hd).ok());
  ASSERT_TRUE(AwaitState(**engine, *hd, JobState::kCancelled));
  EXPECT_FALSE((*engine)->Pause(*hd).ok());
  EXPECT_FALSE((*engine)->Resume(*hd).ok());
}

}  // namespace
}  // namespace rp::scheduler

#include <filesystem>
#include <fstream>

namespace rp::scheduler {
namespace {

// Runs `batches` through a fresh job of `spec` (optionally checkpointing after `ckpt_after`
// batches into `ckpt_dir`) and returns the final fp32 weights.
std::map<std::string, at::Tensor> Train(const JobSpec& spec, const std::vector<at::Tensor>& batches,
                                        int ckpt_after = -1, const std::string& ckpt_dir = "") {
  auto engine = Engine::Create({"cpu:2"});
  EXPECT_TRUE(engine.ok());
  auto id = (*engine)->Submit(spec);
  EXPECT_TRUE(id.ok()) << id.status();
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(batches[i])).ok());
    if (static_cast<int>(i) + 1 == ckpt_after) {
      // Wait until those batches were trained, then checkpoint at the boundary.
      int trained = 0;
      for (int k = 0; k < 500 && trained < ckpt_after; ++k) {
        auto ev = (*engine)->AwaitEvents(*id, 20ms);
        for (const auto& e : *ev) trained += e.kind == JobEvent::Kind::kIteration;
      }
      auto info = (*engine)->Checkpoint(*id, "test");
      EXPECT_TRUE(info.ok()) << info.status();
      if (info.ok()) {
        EXPECT_EQ(info->batches_consumed, ckpt_after);
        EXPECT_EQ(info->step, ckpt_after);
      }
    }
  }
  EXPECT_TRUE((*engine)->CloseInput(*id).ok());
  DrainUntilEnded(**engine, *id);
  EXPECT_EQ(*(*engine)->State(*id), JobState::kSucceeded);
  std::map<std::string, at::Tensor> out;
  auto shapes = (*engine)->ParameterShapes(*id);  // (a named StatusOr: no dangling temporary)
  for (const auto& [name, shape] : *shapes) out[name] = rp::testing::ToTensor(*(*engine)->Parameter(*id, name));
  return out;
}

bool SameWeights(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    if (!at::equal(t, b.at(name))) {
      ADD_FAILURE() << name << " differs by " << (t - b.at(name)).abs().max().item<float>();
      return false;
    }
  }
  return true;
}

TEST(EngineCheckpoint, ResumeContinuesBitIdenticallySyncAndAsync) {
  const std::string root = (std::filesystem::temp_directory_path() / ("rp_ckpt_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 6; ++i) data.push_back(RandomTokens(4, 8, 41, 300 + i));
  for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
    JobSpec spec = TinyJob();
    spec.optimizer_mode = mode;
    spec.lr_schedule = {LrScheduleSpec::Kind::kWarmupCosine, 2, 6, 0.1};  // the schedule position matters
    spec.checkpoint_root = root + (mode == planning::OptimizerMode::kSync ? "/sync" : "/async");
    // Straight through, checkpointing (on request) after 3 batches on the way.
    auto straight = Train(spec, data, 3);
    // A new engine resumes from the checkpoint with the remaining batches.
    JobSpec resumed = spec;
    resumed.resume_from = spec.checkpoint_root + "/step-3";
    resumed.checkpoint_root = spec.checkpoint_root + "-resumed";
    auto continued = Train(resumed, {data.begin() + 3, data.end()});
    EXPECT_TRUE(SameWeights(straight, continued)) << (mode == planning::OptimizerMode::kSync ? "sync" : "async");
    if (mode == planning::OptimizerMode::kSync) {
      // In sync mode a checkpoint changes nothing: equal to a run that never checkpointed.
      JobSpec plain = spec;
      plain.checkpoint_root = root + "/plain";
      EXPECT_TRUE(SameWeights(Train(plain, data), straight));
    }
    // The every-N-steps policy: checkpoints at exactly 2, 4 and 6 steps (keep_last 2 keeps 4, 6);
    // resuming from step-4 with the last two batches ends where the straight run ends.
    JobSpec policy = spec;
    policy.checkpoint_root = spec.checkpoint_root + "-policy";
    policy.checkpoint_every = 2;
    policy.checkpoint_keep_last = 2;
    auto with_policy = Train(policy, data);
    EXPECT_FALSE(std::filesystem::exists(policy.checkpoint_root + "/step-2"));  // pruned
    ASSERT_TRUE(std::filesystem::exists(policy.checkpoint_root + "/step-4/meta.json"));
    JobSpec from4 = policy;
    from4.resume_from = policy.checkpoint_root + "/step-4";
    from4.checkpoint_root = policy.checkpoint_root + "-resumed";
    EXPECT_TRUE(SameWeights(with_policy, Train(from4, {data.begin() + 4, data.end()})));
  }
  // A damaged checkpoint is detected, not loaded.
  {
    std::fstream f(root + "/sync/step-3/weights.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto engine = Engine::Create({"cpu:2"});
  JobSpec bad = TinyJob();
  bad.resume_from = root + "/sync/step-3";
  auto id = (*engine)->Submit(bad);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kDataLoss) << id.status();
  EXPECT_NE(id.status().message().find("checksum"), std::string::npos) << id.status();
  std::filesystem::remove_all(root);
}

// bf16 moments through the engine: a run resumed from a checkpoint ends bit-identical to the
// straight run (the rounding bits are a function of seed, step and element), the checkpoint's
// optimizer state is about half the fp32 one, and the option really changes the training.
TEST(EngineCheckpoint, Bf16MomentsResumeBitIdenticallyAndHalveTheOptimizerState) {
  const std::string root = (std::filesystem::temp_directory_path() / ("rp_bf16m_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 6; ++i) data.push_back(RandomTokens(4, 8, 41, 500 + i));
  for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
    const std::string tag = mode == planning::OptimizerMode::kSync ? "sync" : "async";
    SCOPED_TRACE(tag);
    JobSpec fp32 = TinyJob();
    fp32.optimizer_mode = mode;
    fp32.checkpoint_root = root + "/fp32-" + tag;
    JobSpec spec = fp32;
    spec.optimizer.bf16_moments = true;
    spec.checkpoint_root = root + "/bf16-" + tag;
    auto straight = Train(spec, data, 3);
    JobSpec resumed = spec;
    resumed.resume_from = spec.checkpoint_root + "/step-3";
    resumed.checkpoint_root = spec.checkpoint_root + "-resumed";
    EXPECT_TRUE(SameWeights(straight, Train(resumed, {data.begin() + 3, data.end()})));
    auto reference = Train(fp32, data, 3);
    bool differs = false;  // the moments really are bf16: the training is not the fp32 one
    for (const auto& [name, t] : straight) differs = differs || !at::equal(t, reference.at(name));
    EXPECT_TRUE(differs);
    const auto half = std::filesystem::file_size(spec.checkpoint_root + "/step-3/optimizer.safetensors");
    const auto full = std::filesystem::file_size(fp32.checkpoint_root + "/step-3/optimizer.safetensors");
    EXPECT_LT(static_cast<double>(half), 0.6 * static_cast<double>(full)) << half << " vs " << full;
  }
  std::filesystem::remove_all(root);
}

// SGD (momentum, Nesterov), Lion and Adafactor through the engine: each trains differently from
// AdamW, its checkpoint holds its state (SGD and Lion one buffer per parameter; Adafactor the
// factored row and column variances of each matrix, the full variance of each vector), and a
// resumed run ends bit-identical to the straight run, sync and async; a checkpoint of another
// optimizer's state is refused.
TEST(EngineCheckpoint, SgdLionAndAdafactorResumeBitIdentically) {
  const std::string root =
      (std::filesystem::temp_directory_path() / ("rp_sgd_lion_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 5; ++i) data.push_back(RandomTokens(4, 8, 41, 900 + i));
  JobSpec adamw = TinyJob();
  adamw.checkpoint_root = root + "/adamw";
  const auto reference = Train(adamw, data);
  for (auto algorithm :
       {OptimizerSpec::Algorithm::kSgd, OptimizerSpec::Algorithm::kLion, OptimizerSpec::Algorithm::kAdafactor}) {
    for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
      const std::string tag =
          runtime::OptimizerName(algorithm) + (mode == planning::OptimizerMode::kSync ? "-sync" : "-async");
      SCOPED_TRACE(tag);
      JobSpec spec = TinyJob();
      spec.optimizer.algorithm = algorithm;
      spec.optimizer_mode = mode;
      if (algorithm == OptimizerSpec::Algorithm::kSgd) {
        spec.optimizer.lr = 0.05;
        spec.optimizer.momentum = 0.9;
        spec.optimizer.nesterov = true;
      } else if (algorithm == OptimizerSpec::Algorithm::kLion) {
        spec.optimizer.beta2 = 0.99;
      } else {
        spec.optimizer.lr = 1e-2;
        spec.optimizer.weight_decay = 0.01;
      }
      spec.checkpoint_root = root + "/" + tag;
      auto straight = Train(spec, data, 2);
      bool differs = false;
      for (const auto& [name, t] : straight) differs = differs || !at::equal(t, reference.at(name));
      EXPECT_TRUE(differs) << "trains like AdamW";
      auto state = workers::io::SafetensorsFile::Open(spec.checkpoint_root + "/step-2/optimizer.safetensors");
      ASSERT_TRUE(state.ok()) << state.status();
      if (algorithm != OptimizerSpec::Algorithm::kAdafactor) {
        for (const auto& t : (*state)->tensors()) EXPECT_EQ(t.name.rfind("m.", 0), 0u) << t.name;  // one buffer
      } else {
        // A matrix [r, c] keeps m [r, 1] and v [1, c]; a vector its full variance in v.
        auto weights = workers::io::SafetensorsFile::Open(spec.checkpoint_root + "/step-2/weights.safetensors");
        ASSERT_TRUE(weights.ok());
        int matrices = 0;
        for (const auto& w : (*weights)->tensors()) {
          const auto* m = (*state)->Find("m." + w.name);
          const auto* v = (*state)->Find("v." + w.name);
          ASSERT_NE(v, nullptr) << w.name;
          if (w.shape.size() >= 2) {
            ++matrices;
            ASSERT_NE(m, nullptr) << w.name;
            EXPECT_EQ(m->shape, (std::vector<int64_t>{w.shape[0], 1})) << w.name;
            EXPECT_EQ(v->shape, (std::vector<int64_t>{1, w.shape[1]})) << w.name;
          } else {
            EXPECT_EQ(m, nullptr) << w.name;
            EXPECT_EQ(v->shape, w.shape) << w.name;
          }
        }
        EXPECT_GT(matrices, 5);
      }
      EXPECT_FALSE((*state)->tensors().empty());
      JobSpec resumed = spec;
      resumed.resume_from = spec.checkpoint_root + "/step-2";
      resumed.checkpoint_root = spec.checkpoint_root + "-resumed";
      EXPECT_TRUE(SameWeights(straight, Train(resumed, {data.begin() + 2, data.end()})));
      // Another optimizer's state is not this one's.
      auto engine = Engine::Create({"cpu:2"});
      JobSpec wrong = TinyJob();
      wrong.resume_from = resumed.resume_from;
      auto id = (*engine)->Submit(wrong);
      ASSERT_FALSE(id.ok());
      EXPECT_NE(id.status().message().find("optimizer is adamw"), std::string::npos) << id.status();
    }
  }
  std::filesystem::remove_all(root);
}

// A LoRA checkpoint holds the adapters and their moments, and describes the base instead of
// storing it: resuming from it ends bit-identical to the straight run (the base comes from the
// job's own source, checked against the record); a job on another base is refused, naming the
// tensor, before anything is loaded. After the job ended its base parameters are still readable
// (from the rebuilt seeded base, checked against the record).
TEST(EngineCheckpoint, LoraCheckpointsHoldOnlyTheAdaptersAndRefuseAnotherBase) {
  const std::string root =
      (std::filesystem::temp_directory_path() / ("rp_lora_ckpt_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 5; ++i) data.push_back(RandomTokens(4, 8, 41, 700 + i));
  JobSpec spec = TinyJob();
  spec.model.lora.rank = 2;
  spec.precision = Precision::kBFloat16;  // the base lives in bf16 master copies
  spec.optimizer_mode = planning::OptimizerMode::kAsync;
  spec.checkpoint_root = root + "/straight";
  auto straight = Train(spec, data, 2);
  const std::string ckpt = spec.checkpoint_root + "/step-2";
  // Only the adapters' fp32 weights: a fraction of what the whole model in fp32 would be.
  auto weights = workers::io::SafetensorsFile::Open(ckpt + "/weights.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  int64_t adapter_params = 0;
  for (const auto& t : (*weights)->tensors()) {
    EXPECT_NE(t.name.find(".lora_"), std::string::npos) << t.name << " is not an adapter";
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    adapter_params += n;
  }
  EXPECT_EQ(adapter_params, spec.model.LoraParams());
  auto meta = workers::io::VerifyCheckpoint(ckpt);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->base_fingerprint.size(), 8u);
  auto base = workers::io::ReadCheckpointBase(ckpt);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->fingerprint, meta->base_fingerprint);
  EXPECT_GT(base->tensors.size(), 10u);
  // Resumed: bit-identical, base parameters included (read after the job from the rebuilt base).
  JobSpec resumed = spec;
  resumed.resume_from = ckpt;
  resumed.checkpoint_root = root + "/resumed";
  EXPECT_TRUE(SameWeights(straight, Train(resumed, {data.begin() + 2, data.end()})));
  // Another base (another seed initialises it differently): the job fails naming a base tensor.
  auto engine = Engine::Create({"cpu:2"});
  JobSpec other = resumed;
  other.seed = spec.seed + 1;
  other.checkpoint_root = root + "/other";
  auto id = (*engine)->Submit(other);
  ASSERT_TRUE(id.ok()) << id.status();
  const auto events = DrainUntilEnded(**engine, *id);
  EXPECT_EQ(*(*engine)->State(*id), JobState::kFailed);
  std::string why;
  for (const auto& e : events) {
    if (e.kind == JobEvent::Kind::kState && e.state == JobState::kFailed) why = e.message;
  }
  EXPECT_NE(why.find("base tensor model.embed_tokens.weight has other values"), std::string::npos) << why;
  // The same base in another precision is another base too (the fingerprint is over the bytes
  // the workers upload), and is told so.
  JobSpec fp32 = resumed;
  fp32.precision = Precision::kFloat32;
  fp32.checkpoint_root = root + "/fp32";
  id = (*engine)->Submit(fp32);
  ASSERT_TRUE(id.ok()) << id.status();
  why.clear();
  for (const auto& e : DrainUntilEnded(**engine, *id)) {
    if (e.kind == JobEvent::Kind::kState && e.state == JobState::kFailed) why = e.message;
  }
  EXPECT_NE(why.find("was BF16, this job's is F32"), std::string::npos) << why;
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace rp::scheduler

namespace rp::scheduler {
namespace {

int64_t SelfRssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// A queued job costs no host memory: Submit validates and returns; the store is built when the
// runner takes the job. A Qwen3-32B job (about 650 GB of host state in fp32) is admitted behind a
// running job and cancelled before it starts: it never exists in memory.
TEST(Engine, AQueuedJobIsNotBuiltUntilItRuns) {
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  JobSpec small = TinyJob();
  auto running = (*engine)->Submit(small);
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE((*engine)->FeedBatch(*running, rp::testing::ToBatch(RandomTokens(4, 8, small.model.vocab, 1))).ok());
  ASSERT_TRUE(AwaitState(**engine, *running, JobState::kRunning));
  JobSpec big;
  big.name = "big";
  big.model = *planning::ModelPreset("qwen3-32b");
  big.model.lora.rank = 0;
  big.precision = Precision::kBFloat16;
  const int64_t before = SelfRssKiB();
  auto queued = (*engine)->Submit(big);
  ASSERT_TRUE(queued.ok()) << queued.status();
  const int64_t after = SelfRssKiB();
  EXPECT_LT(after - before, 64 * 1024) << "Submit allocated " << (after - before) << " KiB";
  EXPECT_EQ(*(*engine)->State(*queued), JobState::kQueued);
  // Nothing to read yet, but its shapes are known (export planning needs no store).
  EXPECT_EQ((*engine)->Parameter(*queued, "model.norm.weight").status().code(), absl::StatusCode::kFailedPrecondition);
  auto shapes = (*engine)->ParameterShapes(*queued);
  ASSERT_TRUE(shapes.ok());
  EXPECT_EQ(shapes->size(), 2u + 64 * 11 + 1);  // embed + norm + 64 blocks x 11 + lm_head
  ASSERT_TRUE((*engine)->Cancel(*queued).ok());
  EXPECT_EQ(*(*engine)->State(*queued), JobState::kCancelled);
  ASSERT_TRUE((*engine)->CloseInput(*running).ok());
  DrainUntilEnded(**engine, *running);
  EXPECT_EQ(*(*engine)->State(*running), JobState::kSucceeded);
  EXPECT_LT(SelfRssKiB() - before, 64 * 1024);
}

// Many feeders into one job: the queue and the waiting room together never hold more than
// 2 x max_queued_batches, whatever the number of callers; every accepted feed completes exactly
// once (queued, then trained), the rest are told to retry; loading is reported as progress.
TEST(Engine, AsyncFeedsAreBoundedPerJobAcrossAllCallers) {
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  JobSpec spec = TinyJob();
  spec.max_queued_batches = 3;
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*engine)->Pause(*id).ok());  // held back: nothing drains the queue yet
  std::atomic<int> completed_ok{0}, completed_other{0}, refused{0}, accepted{0};
  std::vector<std::thread> feeders;
  for (int t = 0; t < 16; ++t) {
    feeders.emplace_back([&, t] {
      absl::Status st =
          (*engine)->FeedBatchAsync(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 200 + t)),
                                    [&](absl::Status done) { (done.ok() ? completed_ok : completed_other)++; });
      if (st.ok()) {
        ++accepted;
      } else {
        EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
        ++refused;
      }
    });
  }
  for (auto& f : feeders) f.join();
  EXPECT_EQ(accepted.load(), 2 * spec.max_queued_batches);
  EXPECT_EQ(refused.load(), 16 - 2 * spec.max_queued_batches);
  EXPECT_EQ((*engine)->Info(*id)->queued_batches, 2 * spec.max_queued_batches);
  EXPECT_EQ(completed_ok.load(), spec.max_queued_batches) << "the first ones are queued at once";
  // A synchronous feed waits behind the waiting room, then times out.
  EXPECT_EQ((*engine)->FeedBatch(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 1)), 20ms).code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE((*engine)->Resume(*id).ok());
  for (int i = 0; i < 500 && completed_ok.load() < accepted.load(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(completed_ok.load(), accepted.load());
  ASSERT_TRUE((*engine)->CloseInput(*id).ok());
  auto events = DrainUntilEnded(**engine, *id);
  EXPECT_EQ(completed_other.load(), 0);
  int iterations = 0, progress = 0;
  for (const auto& e : events) {
    iterations += e.kind == JobEvent::Kind::kIteration;
    if (e.kind == JobEvent::Kind::kProgress) {
      ++progress;
      EXPECT_EQ(iterations, 0) << "progress is reported while loading, before training";
    }
  }
  EXPECT_EQ(iterations, accepted.load());
  EXPECT_GE(progress, 1);
  EXPECT_EQ((*engine)->Info(*id)->steps_done, accepted.load());
}

// A job that ends with feeds still waiting tells each of them so, once.
TEST(Engine, WaitingFeedsOfACancelledJobCompleteWithAnError) {
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  JobSpec spec = TinyJob();
  spec.max_queued_batches = 1;
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE((*engine)->Pause(*id).ok());
  std::atomic<int> ok{0}, failed{0};
  auto done = [&](absl::Status st) { (st.ok() ? ok : failed)++; };
  ASSERT_TRUE((*engine)->FeedBatchAsync(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 1)), done).ok());
  ASSERT_TRUE((*engine)->FeedBatchAsync(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 2)), done).ok());
  EXPECT_EQ(ok.load(), 1);
  ASSERT_TRUE((*engine)->Cancel(*id).ok());
  // A job the runner already built (paused) ends on the runner, which then answers its waiting
  // feeds; one that never started ends inside Cancel. Either way, once it has ended:
  DrainUntilEnded(**engine, *id);
  EXPECT_EQ(*(*engine)->State(*id), JobState::kCancelled);
  EXPECT_EQ(failed.load(), 1);
  EXPECT_EQ((*engine)->FeedBatchAsync(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 3)), done).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ok.load() + failed.load(), 2);
}

// A token-file job is read by the runner itself: no feeding, FeedBatch refused, every batch of
// every epoch trained in order, and the job equals the same batches streamed.
TEST(Engine, TokenFileJobsAreReadByTheRunner) {
  const std::string path = ::testing::TempDir() + "/engine_tokens_" + std::to_string(getpid()) + ".bin";
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 4 * 8 * 3 + 1; ++i) {  // three batches of 4 x 8 (+1 for the last target)
      const uint16_t t = static_cast<uint16_t>((i * 7) % 41);
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  JobSpec spec = TinyJob();
  spec.token_file = TokenFileSource{path, TokenFileSource::Format::kBinUint16, 4, 8, 2};
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ((*engine)->FeedBatch(*id, rp::testing::ToBatch(RandomTokens(4, 8, 41, 1))).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*engine)->Info(*id)->total_steps, 6);
  auto events = DrainUntilEnded(**engine, *id);
  EXPECT_EQ(*(*engine)->State(*id), JobState::kSucceeded);
  std::vector<double> file_losses;
  for (const auto& e : events) {
    if (e.kind == JobEvent::Kind::kIteration) file_losses.push_back(e.stats.loss);
  }
  ASSERT_EQ(file_losses.size(), 6u);  // 3 batches x 2 epochs
  EXPECT_EQ((*engine)->Info(*id)->batches_consumed, 6);
  // The same windows streamed: tokens[i..i+8), labels shifted by one.
  JobSpec streamed = TinyJob();
  auto sid = (*engine)->Submit(streamed);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int b = 0; b < 3; ++b) {
      Batch batch;
      batch.rows = 4;
      batch.cols = 8;
      for (int r = 0; r < 4; ++r) {
        for (int c = 0; c < 8; ++c) {
          const int i = (b * 4 + r) * 8 + c;
          batch.tokens.push_back((i * 7) % 41);
          batch.labels.push_back(((i + 1) * 7) % 41);
        }
      }
      ASSERT_TRUE((*engine)->FeedBatch(*sid, batch).ok());
    }
  }
  ASSERT_TRUE((*engine)->CloseInput(*sid).ok());
  std::vector<double> stream_losses;
  for (const auto& e : DrainUntilEnded(**engine, *sid)) {
    if (e.kind == JobEvent::Kind::kIteration) stream_losses.push_back(e.stats.loss);
  }
  EXPECT_EQ(stream_losses, file_losses);
  std::remove(path.c_str());
}

// Runs `spec` (a data-file job) and expects its per-step losses to equal the plain LibTorch
// reference on windows of `tokens` in file order, with targets masked where `trained` is 0.
void ExpectTrainsLikeTheReference(Engine& engine, const JobSpec& spec, const std::vector<int64_t>& tokens,
                                  const std::vector<int>& trained) {
  const int64_t B = spec.token_file->global_batch, S = spec.token_file->sequence_length;
  auto id = engine.Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<double> got;
  for (const auto& e : DrainUntilEnded(engine, *id)) {
    if (e.kind == JobEvent::Kind::kIteration) got.push_back(e.stats.loss);
  }
  ASSERT_EQ(*engine.State(*id), JobState::kSucceeded) << engine.Info(*id)->message;
  const int64_t batches = (static_cast<int64_t>(tokens.size()) - 1) / S / B;
  ASSERT_EQ(static_cast<int64_t>(got.size()), batches);
  ASSERT_GE(batches, 5);
  workers::HostModelStore init(rp::testing::ConfigOf(spec.model), at::kFloat, spec.seed);
  rp::testing::ReferenceModel ref(init, runtime::ToAdamW(spec.optimizer));
  int64_t masked = 0;
  for (int64_t b = 0; b < batches; ++b) {
    at::Tensor t = at::empty({B, S}, at::kLong), l = at::empty({B, S}, at::kLong);
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t c = 0; c < S; ++c) {
        const int64_t i = (b * B + r) * S + c;
        t[r][c] = tokens[i];
        l[r][c] = trained[i + 1] ? tokens[i + 1] : -100;
        masked += trained[i + 1] ? 0 : 1;
      }
    }
    const double want = ref.Step(t, l);
    EXPECT_NEAR(got[b], want, 1e-5 * want) << "step " << b;
  }
  EXPECT_GT(masked, batches * B * S / 5);  // the masks really mask
}

// The oracle's directory (made once for every test process; read only) and its expected.json.
nlohmann::json MakeFixture(const std::string& script, std::string* dir, const std::string& args = "",
                           const std::vector<std::string>& key_files = {}) {
  auto made = rp::testing::CachedOracle(RP_VENV_PYTHON, RP_TEST_DIR "/" + script, args, key_files);
  EXPECT_TRUE(made.ok()) << made.status();
  *dir = made.ok() ? *made : std::string("/nonexistent");
  return nlohmann::json::parse(rp::testing::ReadWholeFile(*dir + "/expected.json"), nullptr, false);
}

// A JSONL prompt/completion dataset read and tokenized by the runner trains exactly like the plain
// LibTorch reference on the tokens and masks PyPI `tokenizers` gives (make_jsonl_dataset.py).
TEST(Engine, JsonlJobTrainsLikeTheReferenceOnTheSameTokensAndMasks) {
  std::string dir;
  const auto expected = MakeFixture("make_jsonl_dataset.py", &dir);
  ASSERT_FALSE(expected.is_discarded());
  JobSpec spec = TinyJob();
  spec.model.vocab = expected["vocab"].get<int>();
  spec.token_file = TokenFileSource{dir + "/train.jsonl", TokenFileSource::Format::kAuto, 4, 16, 1};
  spec.token_file->tokenizer_dir = dir + "/tok";
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  ExpectTrainsLikeTheReference(**engine, spec, expected["tokens"].get<std::vector<int64_t>>(),
                               expected["trained"].get<std::vector<int>>());
  // A dataset the tokenizer cannot cover is refused at Submit, naming the vocabularies.
  JobSpec small = spec;
  small.model.vocab = 100;
  auto refused = (*engine)->Submit(small);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("but the model's vocabulary is 100"), std::string::npos)
      << refused.status();
  JobSpec no_tokenizer = spec;
  no_tokenizer.token_file->tokenizer_dir.clear();
  EXPECT_NE(std::string((*engine)->Submit(no_tokenizer).status().message()).find("needs a tokenizer"),
            std::string::npos);
}

// Chat rendered by `roundpipe_client.py prepare` with the model's chat template trains on the
// assistant turns only, exactly like the reference on transformers' tokens and assistant mask.
TEST(Engine, PreparedChatTrainsLikeTheReferenceOnTheAssistantTurns) {
  std::string dir;
  const auto expected =
      MakeFixture("make_chat_dataset.py", &dir, " " RP_CLIENT_PY_DIR, {RP_CLIENT_PY_DIR "/roundpipe_prepare.py"});
  ASSERT_FALSE(expected.is_discarded());
  JobSpec spec = TinyJob();
  spec.model.vocab = expected["vocab"].get<int>();
  spec.token_file = TokenFileSource{dir + "/markers.safetensors", TokenFileSource::Format::kAuto, 4, 16, 1};
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  ExpectTrainsLikeTheReference(**engine, spec, expected["tokens"].get<std::vector<int64_t>>(),
                               expected["trained"].get<std::vector<int>>());
}

}  // namespace
}  // namespace rp::scheduler

#include <malloc.h>

#include "tests/support/bf16_model_dir.h"

namespace rp::scheduler {
namespace {

int64_t SelfStatusKiB(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  }
  return -1;
}

// Runs one iteration of a LoRA job on `dir` in `precision` and returns how much the process's
// anonymous memory (RssAnon) grew while the job holds its store, and the engine's stats then.
std::pair<int64_t, EngineStats> AnonGrowthOfALoraJob(const JobSpec& spec) {
  // Every block of 128 KiB or more comes from (and returns to) the kernel: the CPU workers'
  // stage copies, freed after each stage, do not linger in malloc's heap and count as the job's.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  auto engine = Engine::Create({"cpu:2"});
  EXPECT_TRUE(engine.ok());
  const int64_t before = SelfStatusKiB("RssAnon");
  auto id = (*engine)->Submit(spec);
  EXPECT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(RandomTokens(2, 16, spec.model.vocab, 9))).ok());
  bool trained = false;
  for (int i = 0; i < 600 && !trained; ++i) {
    auto events = (*engine)->AwaitEvents(*id, 100ms);  // named: the loop must not outlive a temporary
    for (const auto& e : *events) trained = trained || e.kind == JobEvent::Kind::kIteration;
  }
  EXPECT_TRUE(trained);
  const int64_t grown = (SelfStatusKiB("RssAnon") - before) * 1024;
  const EngineStats stats = (*engine)->Stats();
  EXPECT_TRUE((*engine)->Cancel(*id).ok());
  return {grown, stats};
}

// A LoRA job's frozen base is used where it lies in the model file when its dtype is the job's:
// the daemon's anonymous memory grows by far less than the base (the pages are the file's, which
// the kernel may drop), and the engine reports them as mapped. The same job in fp32 (the base
// must be converted) allocates its base: twice the file's size more.
TEST(EngineHostMemory, ALoraBaseInTheJobsDtypeIsMappedNotCopied) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("rp_mapped_base_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  JobSpec spec = TinyJob();
  spec.model.family = "llama";
  spec.model.qk_norm = false;
  spec.model.vocab = 32000;
  spec.model.hidden = 512;
  spec.model.intermediate = 1376;
  spec.model.num_blocks = 8;
  spec.model.num_heads = 8;
  spec.model.num_kv_heads = 4;
  spec.model.head_dim = 64;
  spec.model.lora.rank = 4;
  spec.precision = Precision::kBFloat16;
  spec.hf_dir = dir;
  const int64_t file = rp::testing::WriteBf16ModelDir(dir, rp::testing::ConfigOf(spec.model));
  ASSERT_GT(file, int64_t{100} << 20);
  auto [mapped_growth, mapped_stats] = AnonGrowthOfALoraJob(spec);
  JobSpec fp32 = spec;
  fp32.precision = Precision::kFloat32;
  auto [copied_growth, copied_stats] = AnonGrowthOfALoraJob(fp32);
  std::printf("base file %.1f MiB: RssAnon +%.1f MiB mapped (bf16 job), +%.1f MiB copied (fp32 job)\n",
              static_cast<double>(file) / (1 << 20), static_cast<double>(mapped_growth) / (1 << 20),
              static_cast<double>(copied_growth) / (1 << 20));
  // The job's own working memory (stage copies on the CPU workers, activations, threads) is
  // there in both runs: about 30 MiB here, whatever the base's size.
  EXPECT_LT(mapped_growth, file / 2);
  EXPECT_GT(copied_growth - mapped_growth, file * 3 / 2);  // the fp32 base: twice the file
  EXPECT_EQ(mapped_stats.host_mapped_bytes, file);
  EXPECT_LT(mapped_stats.host_model_bytes, file / 10);
  EXPECT_EQ(copied_stats.host_mapped_bytes, 0);
  EXPECT_GT(copied_stats.host_model_bytes, file * 2 - (int64_t{1} << 20));
  std::filesystem::remove_all(dir);
}

// Admission counts a mapped base as nothing: a LoRA job on an 8B base stored in bf16 (a sparse
// file: the header is real, the data a hole) predicts the adapters' state alone in bf16, and
// the whole base converted to fp32 masters otherwise; the same function the store is checked
// against (model_adapter_test).
TEST(EngineHostMemory, AdmissionCountsAMappedBaseAsNothing) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("rp_sparse_8b_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  JobSpec spec;
  spec.model = *planning::ModelPreset("llama-3.1-8b");
  spec.model.lora.rank = 16;
  spec.precision = Precision::kBFloat16;
  spec.hf_dir = dir;
  const int64_t file = rp::testing::WriteBf16ModelDir(dir, rp::testing::ConfigOf(spec.model), /*sparse=*/true);
  EXPECT_GT(file, int64_t{14} << 30);
  auto mapped = PredictHostStateBytes(spec);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_LT(*mapped, int64_t{1} << 30);
  EXPECT_EQ(*mapped, planning::HostStateBytes(spec.model, {.master_bytes = 2, .mapped_base = true}));
  spec.precision = Precision::kFloat32;
  auto copied = PredictHostStateBytes(spec);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_GT(*copied, 2 * file);
  // A directory without the weights is an error naming the file, not a guess.
  std::filesystem::remove(dir + "/model.safetensors");
  EXPECT_FALSE(PredictHostStateBytes(spec).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rp::scheduler
