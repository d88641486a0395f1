// Jobs side by side on one pool of workers (EngineOptions::max_running_jobs): each job, with
// others running beside it (different shares, sync and async, dense, LoRA and MoE, submitted at
// different moments), ends with every parameter bit-identical to the same job run alone; a
// queued job says what it waits for (a running slot, host memory, a job ahead of it).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>

#include "scheduler/engine.h"
#include "scheduler/planning/presets.h"
#include "tests/support/engine_values.h"
#include "tests/unit/scheduler/engine_test_jobs.h"
#include "workers/device/test_hooks.h"

namespace rp::scheduler {
namespace {

struct PoolJob {
  JobSpec spec;
  int batches = 4;
  int seed = 0;  // of the batches
};

PoolJob DenseSync() {
  PoolJob j{TinyJob(), 4, 100};
  j.spec.microbatches = 2;
  return j;
}

PoolJob DenseAsyncShare3() {
  PoolJob j{TinyJob(), 5, 200};
  j.spec.seed = 9;
  j.spec.microbatches = 2;
  j.spec.optimizer_mode = planning::OptimizerMode::kAsync;
  j.spec.share = 3;
  return j;
}

PoolJob LoraSync() {
  PoolJob j{TinyJob(), 4, 300};
  j.spec.seed = 11;
  j.spec.microbatches = 2;
  j.spec.model.lora.rank = 2;
  j.spec.model.lora.alpha = 4;
  j.spec.share = 0.5;
  return j;
}

PoolJob MoeAsync() {
  PoolJob j;
  j.spec.model = *planning::ModelPreset("qwen3-moe-tiny");
  j.spec.model.num_blocks = 2;
  j.spec.optimizer.lr = 3e-3;
  j.spec.microbatches = 2;
  j.spec.optimizer_mode = planning::OptimizerMode::kAsync;
  j.spec.share = 2;
  j.batches = 3;
  j.seed = 400;
  return j;
}

void Feed(Engine& e, JobId id, const PoolJob& j, int from, int to) {
  for (int b = from; b < to; ++b) {
    at::Tensor t = RandomTokens(4, 8, j.spec.model.vocab, j.seed + b);
    ASSERT_TRUE(e.FeedBatch(id, rp::testing::ToBatch(t)).ok());
  }
}

using Params = std::map<std::string, std::vector<float>>;

Params AllParams(Engine& e, JobId id) {
  Params out;
  auto shapes = e.ParameterShapes(id);
  EXPECT_TRUE(shapes.ok()) << shapes.status();
  for (const ParameterShape& p : *shapes) {
    auto v = e.Parameter(id, p.name);
    EXPECT_TRUE(v.ok()) << p.name << ": " << v.status();
    if (v.ok()) out[p.name] = v->data;
  }
  return out;
}

Params RunAlone(const PoolJob& j) {
  auto engine = Engine::Create({"cpu:2"});
  EXPECT_TRUE(engine.ok());
  auto id = (*engine)->Submit(j.spec);
  EXPECT_TRUE(id.ok()) << id.status();
  Feed(**engine, *id, j, 0, j.batches);
  EXPECT_TRUE((*engine)->CloseInput(*id).ok());
  DrainUntilEnded(**engine, *id);
  EXPECT_EQ(*(*engine)->State(*id), JobState::kSucceeded);
  return AllParams(**engine, *id);
}

void ExpectBitIdentical(const Params& got, const Params& want, const std::string& job) {
  ASSERT_EQ(got.size(), want.size()) << job;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << job << ": " << name;
    EXPECT_EQ(it->second, w) << job << ": " << name << " differs from the job run alone";
  }
}

TEST(EnginePool, JobsSideBySideEndBitIdenticalToEachRunAlone) {
  const std::vector<PoolJob> jobs = {DenseSync(), DenseAsyncShare3(), LoraSync(), MoeAsync()};
  std::vector<Params> alone;
  for (const PoolJob& j : jobs) alone.push_back(RunAlone(j));

  EngineOptions o;
  o.devices = "cpu:2";
  o.max_running_jobs = 4;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  std::vector<JobId> ids;
  // Submitted at different moments: each while the ones before it are mid-run (fed in part,
  // their input still open), so every job starts while others run.
  for (size_t k = 0; k < jobs.size(); ++k) {
    auto id = e.Submit(jobs[k].spec);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
    ASSERT_TRUE(AwaitState(e, *id, JobState::kRunning)) << "job " << k << " did not start beside the others";
    Feed(e, *id, jobs[k], 0, jobs[k].batches / 2);
  }
  for (size_t k = 0; k < jobs.size(); ++k) EXPECT_EQ(*e.State(ids[k]), JobState::kRunning) << k;
  // The pool as Stats shows it: all four run, with their shares, and each is given compute.
  const auto until = std::chrono::steady_clock::now() + 60s;
  EngineStats stats;
  auto all_computed = [&] {
    stats = e.Stats();
    if (stats.running.size() != jobs.size()) return false;
    for (const auto& r : stats.running) {
      if (r.compute_seconds <= 0) return false;
    }
    return true;
  };
  while (!all_computed() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(all_computed());
  EXPECT_EQ(stats.max_running_jobs, 4);
  for (size_t k = 0; k < jobs.size(); ++k) {
    EXPECT_EQ(stats.running[k].id, ids[k]);
    EXPECT_EQ(stats.running[k].share, jobs[k].spec.share);
  }
  // The rest of every job's data, fed from one thread per job at once.
  std::vector<std::thread> feeders;
  for (size_t k = 0; k < jobs.size(); ++k) {
    feeders.emplace_back([&, k] {
      Feed(e, ids[k], jobs[k], jobs[k].batches / 2, jobs[k].batches);
      EXPECT_TRUE(e.CloseInput(ids[k]).ok());
    });
  }
  for (auto& f : feeders) f.join();
  for (size_t k = 0; k < jobs.size(); ++k) {
    DrainUntilEnded(e, ids[k]);
    ASSERT_EQ(*e.State(ids[k]), JobState::kSucceeded) << k;
    ExpectBitIdentical(AllParams(e, ids[k]), alone[k], "job " + std::to_string(k));
  }
}

// The job's next reasons for waiting (the events up to the first kWaiting, within 10 s).
std::vector<JobWait> Waits(Engine& e, JobId id) {
  std::vector<JobWait> out;
  for (int i = 0; i < 100 && out.empty(); ++i) {
    auto ev = e.AwaitEvents(id, 100ms);
    EXPECT_TRUE(ev.ok());
    for (const JobEvent& x : *ev) {
      if (x.kind == JobEvent::Kind::kWaiting) out.push_back(x.wait);
    }
  }
  return out;
}

TEST(EnginePool, AQueuedJobSaysWhetherItWaitsForASlotOrForAJobAhead) {
  auto engine = Engine::Create({"cpu:1"});  // one running slot
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  auto first = e.Submit(TinyJob());
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(AwaitState(e, *first, JobState::kRunning));
  JobSpec low = TinyJob(), high = TinyJob();
  high.priority = 5;
  auto lo = *e.Submit(low);
  std::vector<JobWait> w = Waits(e, lo);
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w.back().cause, JobWait::Cause::kRunningLimit);
  EXPECT_EQ(w.back().running, std::vector<JobId>{*first});
  EXPECT_EQ(w.back().max_running, 1);
  auto hi = *e.Submit(high);
  w = Waits(e, hi);
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w.back().cause, JobWait::Cause::kRunningLimit);
  w = Waits(e, lo);
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w.back().cause, JobWait::Cause::kBehind);
  EXPECT_EQ(w.back().ahead, hi);
  EXPECT_EQ(w.back().ahead_priority, 5);
  ASSERT_TRUE(e.Cancel(*first).ok());
  ASSERT_TRUE(AwaitState(e, hi, JobState::kRunning));
  w = Waits(e, lo);
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w.back().cause, JobWait::Cause::kRunningLimit);
  EXPECT_EQ(w.back().running, std::vector<JobId>{hi});
  ASSERT_TRUE(e.Cancel(hi).ok());
  ASSERT_TRUE(e.Cancel(lo).ok());
}

TEST(EnginePool, AJobWhoseStatesDoNotFitWaitsForHostMemoryAndStartsWhenTheHostIsFree) {
  EngineOptions o;
  o.devices = "cpu:1";
  o.max_running_jobs = 2;
  o.host_memory_available = [] { return int64_t{1000}; };  // far less than any model's states
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  auto first = *e.Submit(TinyJob());  // nothing runs: it starts whatever the memory says
  ASSERT_TRUE(AwaitState(e, first, JobState::kRunning));
  auto second = *e.Submit(TinyJob());
  std::vector<JobWait> w = Waits(e, second);
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w.back().cause, JobWait::Cause::kHostMemory);
  EXPECT_EQ(w.back().running, std::vector<JobId>{first});
  EXPECT_EQ(w.back().free_bytes, 1000);
  auto info = e.Info(second);
  ASSERT_TRUE(info.ok());
  // The states and, on CPU workers, their stage copies (host memory too).
  EXPECT_GT(info->predicted_worker_bytes, 0);
  EXPECT_EQ(w.back().need_bytes, info->predicted_host_state_bytes + info->predicted_worker_bytes);
  EXPECT_GT(w.back().need_bytes, 1000);
  EXPECT_EQ(*e.State(second), JobState::kQueued);
  ASSERT_TRUE(e.CloseInput(first).ok());  // it ends: nothing runs, the second starts
  ASSERT_TRUE(AwaitState(e, second, JobState::kRunning));
  ASSERT_TRUE(e.Cancel(second).ok());
}

// A runner asks how much host memory is free, then takes a job. A job that started in between
// (another runner's) must count: here every runner pauses 300 ms there, two jobs are submitted
// inside the pause, the first starts, and the second waits for host memory instead of starting
// on the answer given while nothing ran (CI caught that once as a missing wait).
TEST(EnginePool, AJobStartedWhileARunnerAskedForMemoryCountsBeforeTheNextStarts) {
  const workers::OpDelayHook pause = [] { std::this_thread::sleep_for(300ms); };
  workers::SetAdmissionDelayHook(&pause);
  {
    EngineOptions o;
    o.devices = "cpu:1";
    o.max_running_jobs = 2;
    o.host_memory_available = [] { return int64_t{1000}; };
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok());
    Engine& e = **engine;
    std::this_thread::sleep_for(400ms);  // both runners asked (nothing ran) and wait on the queue
    auto first = *e.Submit(TinyJob());
    std::this_thread::sleep_for(50ms);  // both runners are inside the pause, having asked while nothing ran
    auto second = *e.Submit(TinyJob());
    ASSERT_TRUE(AwaitState(e, first, JobState::kRunning));
    std::this_thread::sleep_for(1s);  // the other runner has decided about the second job by now
    EXPECT_EQ(*e.State(second), JobState::kQueued);
    std::vector<JobWait> all;
    for (auto ev = e.AwaitEvents(second, 0ms); ev.ok() && !ev->empty(); ev = e.AwaitEvents(second, 0ms)) {
      for (const JobEvent& x : *ev) {
        if (x.kind == JobEvent::Kind::kWaiting) all.push_back(x.wait);
      }
    }
    ASSERT_FALSE(all.empty());
    EXPECT_EQ(all.back().cause, JobWait::Cause::kHostMemory);
    e.Shutdown();
  }
  workers::SetAdmissionDelayHook(nullptr);
}

TEST(EnginePool, TheRunningLimitAndSharesAreChecked) {
  EngineOptions o;
  o.devices = "cpu:1";
  o.max_running_jobs = 0;
  EXPECT_EQ(Engine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.max_running_jobs = 65;
  EXPECT_EQ(Engine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.max_running_jobs = 2;
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok());
  for (double share : {0.0, -1.0, 1001.0, std::nan("")}) {
    JobSpec s = TinyJob();
    s.share = share;
    auto id = (*engine)->Submit(s);
    ASSERT_FALSE(id.ok()) << share;
    EXPECT_NE(id.status().message().find("share"), std::string::npos) << id.status();
  }
}

}  // namespace
}  // namespace rp::scheduler
