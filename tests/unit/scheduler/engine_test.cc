// The engine through its facade: a job trains like the plain-LibTorch reference (sync, async,
// MoE presets), bad input, backpressure, queueing, priorities, pause and resume.
#include "scheduler/engine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "nlohmann/json.hpp"
#include "scheduler/job_files.h"
#include "scheduler/planning/presets.h"
#include "scheduler/runtime/engine_impl.h"
#include "scheduler/runtime/model_adapter.h"
#include "tests/support/engine_values.h"
#include "tests/support/oracle_cache.h"
#include "tests/support/reference_model.h"
#include "tests/support/run_command.h"
#include "tests/support/tokens.h"
#include "tests/unit/scheduler/engine_test_jobs.h"
#include "workers/io/checkpoint.h"
#include "workers/io/safetensors_reader.h"

namespace rp::scheduler {
namespace {

TEST(Engine, TrainsAJobAndMatchesTheReference) {
  auto engine = Engine::Create({"cpu:3"});
  ASSERT_TRUE(engine.ok()) << engine.status();
  JobSpec spec = TinyJob();
  spec.microbatches = 3;
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  // The reference starts from the same initial weights.
  workers::HostModelStore init(spec.model, at::kFloat, spec.seed);
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
  // Nothing to train on: refused at the feed (the controller used to drop it after queueing).
  Batch unlabelled = rp::testing::ToBatch(RandomTokens(4, 8, V, 1));
  unlabelled.labels.assign(32, Batch::kIgnoreLabel);
  for (const Batch& b : {unlabelled, rp::testing::ToBatch(RandomTokens(4, 1, V, 1))}) {
    const absl::Status st = engine->FeedBatch(id, b);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("no token has a label"), std::string::npos) << st;
  }
  ASSERT_TRUE(fb(RandomTokens(4, 8, V, 1)).ok());
  ASSERT_TRUE(fb(RandomTokens(4, 8, V, 2)).ok());
  auto events = DrainUntilEnded(*engine, id);
  int iterations = 0, dropped = 0;
  for (const auto& e : events) {
    iterations += e.kind == JobEvent::Kind::kIteration;
    dropped += e.kind == JobEvent::Kind::kBatchRejected;
  }
  EXPECT_EQ(iterations, 2);
  EXPECT_EQ(dropped, 0) << "every batch the feed accepted trains";
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
  workers::HostModelStore init(spec.model, at::kFloat, spec.seed);
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

// A job whose round size is chosen with the automatic partition (microbatches_per_round -1)
// trains through the switch; with explicit layer counts the engine refuses it at Submit.
TEST(Engine, ARoundSizeChosenWithThePartitionTrainsAndNeedsTheAutomaticOne) {
  auto engine = *Engine::Create({"cpu:2"});
  JobSpec spec = TinyJob();
  spec.model.vocab = 2000;
  spec.microbatches = 4;
  spec.microbatches_per_round = -1;
  spec.auto_partition = true;
  spec.max_steps = 5;
  auto id = engine->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  for (int it = 0; it < 5; ++it)
    ASSERT_TRUE(engine->FeedBatch(*id, rp::testing::ToBatch(RandomTokens(8, 8, spec.model.vocab, it))).ok());
  int iterations = 0;
  for (const auto& e : DrainUntilEnded(*engine, *id)) {
    if (e.kind == JobEvent::Kind::kIteration) {
      ++iterations;
      EXPECT_TRUE(std::isfinite(e.stats.loss));
    }
  }
  EXPECT_EQ(iterations, 5);
  spec.auto_partition = false;
  spec.partition = planning::Partition{{1, 1, 1, 1}, 1, {1, 1, 1, 1}};
  auto refused = engine->Submit(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("choosing the round size"), std::string::npos) << refused.status();
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

TEST(Engine, PauseHoldsARunningJobBetweenIterationsAndResumeContinuesExactly) {
  for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
    auto engine = Engine::Create({"cpu:2"});
    ASSERT_TRUE(engine.ok());
    JobSpec spec = TinyJob();
    spec.optimizer_mode = mode;
    auto id = (*engine)->Submit(spec);
    ASSERT_TRUE(id.ok());
    workers::HostModelStore init(spec.model, at::kFloat, spec.seed);
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
