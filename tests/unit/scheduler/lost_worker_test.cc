// A lost worker costs no step: a device lost mid-iteration (a fault injected through the test hook
// at one exact operation — a forward slot's compute, the fused B_1, a backward slot's recompute, a
// gradient download, a weight upload) leaves the job to finish on the other workers with every
// parameter and every iteration's loss bit-identical to the same job without the fault, in sync
// and async mode. The lost worker's unfinished slots are re-run elsewhere from the host state
// (scheduler/runtime/slot_recovery.h) and nothing a slot did before the fault is done twice
// (workers/slot_attempt.h). Every test is bounded (a hang fails it).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "scheduler/engine.h"
#include "tests/support/engine_values.h"
#include "tests/unit/scheduler/engine_test_jobs.h"
#include "workers/device/device.h"
#include "workers/device/test_hooks.h"

namespace rp::scheduler {
namespace {

constexpr int kBatches = 4;

JobSpec LostWorkerJob(planning::OptimizerMode mode) {
  JobSpec s = TinyJob();
  s.model.num_blocks = 4;  // 6 layers: F[2,2] B1=2 B[2,2]
  s.partition = planning::Partition{{2, 2}, 2, {2, 2}};
  // Two rounds of three micro-batches: a training slot's gradients then go down in chunks between
  // the next slot's downloads on its worker ("grads B3 c1" exists).
  s.microbatches = 6;
  s.microbatches_per_round = 3;
  s.optimizer_mode = mode;
  return s;
}

struct Outcome {
  std::map<std::string, std::vector<float>> params;
  std::vector<double> losses;
  std::vector<int> workers, slots_rerun;  // per iteration
  std::vector<std::string> partitions;    // per iteration
  std::vector<PlanChange> changes;        // every plan change, in order
  JobState state = JobState::kQueued;
  std::string failure;
};

void Record(const JobEvent& ev, Outcome& out) {
  if (ev.kind == JobEvent::Kind::kIteration) {
    out.losses.push_back(ev.stats.loss);
    out.workers.push_back(ev.stats.workers);
    out.slots_rerun.push_back(ev.stats.slots_rerun);
    out.partitions.push_back(ev.stats.partition);
  }
  if (ev.kind == JobEvent::Kind::kPlanChange) out.changes.push_back(ev.plan_change);
  if (ev.kind == JobEvent::Kind::kState && ev.state == JobState::kFailed) out.failure = ev.message;
}

// Called before batch b is fed (an operator's action mid-job); events it reads go to Record.
using BeforeBatch = std::function<void(Engine&, JobId, int b, Outcome&)>;

Outcome Run(const JobSpec& spec, int batches = kBatches, const BeforeBatch& before = {}) {
  Outcome out;
  auto engine = Engine::Create({"cpu:3"});
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return out;
  Engine& e = **engine;
  auto id = e.Submit(spec);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return out;
  for (int b = 0; b < batches; ++b) {
    if (before) before(e, *id, b, out);
    EXPECT_TRUE(e.FeedBatch(*id, rp::testing::ToBatch(RandomTokens(6, 8, spec.model.vocab, 500 + b))).ok());
  }
  EXPECT_TRUE(e.CloseInput(*id).ok());
  for (const JobEvent& ev : DrainUntilEnded(e, *id)) Record(ev, out);
  out.state = *e.State(*id);
  auto shapes = e.ParameterShapes(*id);
  EXPECT_TRUE(shapes.ok()) << shapes.status();
  if (!shapes.ok()) return out;
  for (const ParameterShape& p : *shapes) {
    auto v = e.Parameter(*id, p.name);
    EXPECT_TRUE(v.ok()) << p.name;
    if (v.ok()) out.params[p.name] = v->data;
  }
  return out;
}

// Loses the device that starts operation `label` of iteration `iteration` (once), or makes that
// operation run out of device memory, through the stream's fault hook, for the lifetime of this
// object.
class InjectedFault {
 public:
  InjectedFault(std::string label, int iteration, workers::Fault fault = workers::Fault::kDeviceLost)
      : label_(std::move(label)), iteration_(iteration), fault_(fault) {
    hook_ = [this](int device, const workers::OpInfo& op) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (op.iteration >= 0) seen_.insert(op.label);
      }
      if (op.iteration != iteration_ || op.label != label_ || fired_.exchange(true)) return workers::Fault::kNone;
      device_ = device;
      return fault_;
    };
    workers::SetFaultHook(&hook_);
  }
  ~InjectedFault() { workers::SetFaultHook(nullptr); }
  bool fired() const { return fired_.load(); }
  int device() const { return device_.load(); }
  std::string seen() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s;
    for (const std::string& l : seen_) s += "\"" + l + "\" ";
    return s;
  }

 private:
  const std::string label_;
  const int iteration_;
  const workers::Fault fault_;
  workers::FaultHook hook_;
  std::atomic<bool> fired_{false};
  std::atomic<int> device_{-1};
  mutable std::mutex mu_;
  std::set<std::string> seen_;
};

void ExpectSameRun(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_EQ(got.state, JobState::kSucceeded) << what << ": " << got.failure;
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[i]) << what << ": iteration " << i << "'s loss";
  }
  ASSERT_EQ(got.params.size(), want.params.size()) << what;
  for (const auto& [name, w] : want.params) {
    auto it = got.params.find(name);
    ASSERT_NE(it, got.params.end()) << what << ": " << name;
    EXPECT_EQ(it->second, w) << what << ": " << name << " differs from the run without the fault";
  }
}

struct FaultPoint {
  const char* label;  // the operation's timeline label (device_worker.cc)
  const char* what;
};

// Iteration 1 of 4 (the second), so the loss lands mid-job: the faulted iteration and the two
// after it run on two workers.
const FaultPoint kPoints[] = {
    {"F2 mb1", "a forward slot's compute (its first micro-batch's outputs already Put)"},
    {"B1 mb2", "the fused B_1 (two micro-batches' loss already added)"},
    {"R B2 mb1", "a backward slot's recompute"},
    {"grads B3 c1", "a gradient download (its first chunk already accumulated)"},
    {"up F1 c0", "a weight upload"},
};

void ExpectEveryFaultPointRecovers(planning::OptimizerMode mode) {
  const JobSpec spec = LostWorkerJob(mode);
  const Outcome clean = Run(spec);
  ASSERT_EQ(clean.state, JobState::kSucceeded) << clean.failure;
  ASSERT_EQ(clean.losses.size(), static_cast<size_t>(kBatches));
  EXPECT_EQ(clean.workers, (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(clean.slots_rerun, (std::vector<int>{0, 0, 0, 0}));
  for (const FaultPoint& p : kPoints) {
    SCOPED_TRACE(p.what);
    InjectedFault fault(p.label, 1);
    const Outcome got = Run(spec);
    ASSERT_TRUE(fault.fired()) << "no operation \"" << p.label << "\" in iteration 1; seen: " << fault.seen();
    ExpectSameRun(got, clean, std::string("device ") + std::to_string(fault.device()) + " lost at \"" + p.label + "\"");
    // The fault's iteration ran on three workers and re-ran the lost one's unfinished slots; the
    // next ones were planned over the two left. In async mode two iterations are in flight: the
    // one before may still have had slots on the lost worker (a weight upload is prefetched
    // while the previous slot runs) and the one after may have been dispatched on three already;
    // those slots are re-run too.
    ASSERT_EQ(got.workers.size(), 4u);
    EXPECT_EQ(got.workers[0], 3);
    EXPECT_EQ(got.workers[1], 3);
    EXPECT_EQ(got.workers[3], 2);
    EXPECT_EQ(got.slots_rerun[3], 0);
    if (mode == planning::OptimizerMode::kSync) {
      EXPECT_EQ(got.workers[2], 2);
      EXPECT_EQ(got.slots_rerun, (std::vector<int>{0, got.slots_rerun[1], 0, 0}));
      EXPECT_GE(got.slots_rerun[1], 1);
    } else {
      EXPECT_GE(got.slots_rerun[0] + got.slots_rerun[1] + got.slots_rerun[2], 1);
      if (got.workers[2] == 2) {
        EXPECT_EQ(got.slots_rerun[2], 0);
      }
    }
  }
}

TEST(LostWorker, EveryFaultPointFinishesBitIdenticalSync) {
  ExpectEveryFaultPointRecovers(planning::OptimizerMode::kSync);
}

TEST(LostWorker, EveryFaultPointFinishesBitIdenticalAsync) {
  ExpectEveryFaultPointRecovers(planning::OptimizerMode::kAsync);
}

// Reads job events (into `out`) until `n` iterations are done (a failure after 60 s).
void AwaitIterations(Engine& e, JobId id, size_t n, Outcome& out) {
  for (int i = 0; i < 600 && out.losses.size() < n; ++i) {
    auto ev = e.AwaitEvents(id, 100ms);
    ASSERT_TRUE(ev.ok());
    for (const JobEvent& x : *ev) Record(x, out);
  }
  ASSERT_GE(out.losses.size(), n) << "the job did not get through " << n << " iterations";
}

// An operator takes worker 1 out of the pool and puts it back while a job runs — gracefully, and
// at once (its slots re-run elsewhere) — and the job still ends bit-identical to a run without.
void ExpectDrainAndEnableKeepTheRun(planning::OptimizerMode mode, bool now) {
  const JobSpec spec = LostWorkerJob(mode);
  constexpr int kLong = 6;
  const Outcome clean = Run(spec, kLong);
  ASSERT_EQ(clean.state, JobState::kSucceeded) << clean.failure;
  const Outcome got = Run(spec, kLong, [now](Engine& e, JobId id, int b, Outcome& out) {
    if (b == 2) {
      AwaitIterations(e, id, 1, out);
      ASSERT_TRUE(e.DrainWorker(1, now).ok());
      const DeviceStats::State want = now ? DeviceStats::State::kLost : DeviceStats::State::kDrained;
      EXPECT_EQ(e.Stats().devices[1].state, want);
      if (now) {
        EXPECT_NE(e.Stats().devices[1].lost_reason.find("drained at once"), std::string::npos);
      }
    }
    if (b == 4) {
      AwaitIterations(e, id, 4, out);
      ASSERT_TRUE(e.EnableWorker(1).ok());
      EXPECT_EQ(e.Stats().devices[1].state, DeviceStats::State::kUp);
    }
  });
  ExpectSameRun(got, clean, now ? "worker 1 drained at once, then enabled" : "worker 1 drained, then enabled");
  ASSERT_EQ(got.workers.size(), static_cast<size_t>(kLong));
  // Batches 2 and 3 were fed after the drain: planned over two workers; 4 and 5 after the enable.
  EXPECT_EQ(got.workers[2], 2);
  EXPECT_EQ(got.workers[3], 2);
  EXPECT_EQ(got.workers[4], 3);
  EXPECT_EQ(got.workers[5], 3);
  // Each change is an event of the job, before the first iteration that ran with it.
  ASSERT_EQ(got.changes.size(), 2u);
  EXPECT_EQ(got.changes[0].cause, now ? PlanChange::Cause::kWorkerLost : PlanChange::Cause::kWorkerDrained);
  EXPECT_EQ(got.changes[0].worker, 1);
  EXPECT_EQ(got.changes[0].workers, 2);
  EXPECT_EQ(got.changes[1].cause, PlanChange::Cause::kWorkerReturned);
  EXPECT_EQ(got.changes[1].worker, 1);
  EXPECT_EQ(got.changes[1].workers, 3);
}

TEST(LostWorker, DrainAndEnableDuringASyncJob) {
  ExpectDrainAndEnableKeepTheRun(planning::OptimizerMode::kSync, /*now=*/false);
}
TEST(LostWorker, DrainAtOnceAndEnableDuringAnAsyncJob) {
  ExpectDrainAndEnableKeepTheRun(planning::OptimizerMode::kAsync, /*now=*/true);
}
TEST(LostWorker, DrainAtOnceAndEnableDuringASyncJob) {
  ExpectDrainAndEnableKeepTheRun(planning::OptimizerMode::kSync, /*now=*/true);
}

// A stage slot that runs out of device memory is repeated (its inputs are still on the host) and
// the job re-plans its partition under a tighter per-stage memory cap. The repeat is exact: a job
// that ends with the faulted iteration equals the run without the fault bit for bit. A longer job
// finishes on the new partition; its losses equal the clean run's up to the first iteration on
// it, and later steps differ only as far as another partition's floating-point order does (the
// engine is exact per partition, not across partitions).
void ExpectOutOfMemoryReplans(planning::OptimizerMode mode) {
  const JobSpec spec = LostWorkerJob(mode);
  // B2 (layers 2..3, a backward slot) runs out of memory in its recompute: the new cap is 3/4 of
  // the two blocks' backward bytes, so no stage of the new partition holds both.
  const char* kWhere = "R B2 mb1";
  {
    const Outcome clean = Run(spec, 2);
    InjectedFault fault(kWhere, 1, workers::Fault::kOutOfMemory);
    const Outcome got = Run(spec, 2);
    ASSERT_TRUE(fault.fired()) << "no operation \"" << kWhere << "\" in iteration 1; seen: " << fault.seen();
    ExpectSameRun(got, clean, "device out of memory at \"R B2 mb1\" in the last iteration");
    EXPECT_GE(got.slots_rerun[0] + got.slots_rerun[1], 1);
  }
  const Outcome clean = Run(spec);
  ASSERT_EQ(clean.state, JobState::kSucceeded) << clean.failure;
  EXPECT_TRUE(clean.changes.empty());
  InjectedFault fault(kWhere, 1, workers::Fault::kOutOfMemory);
  const Outcome got = Run(spec);
  ASSERT_TRUE(fault.fired());
  ASSERT_EQ(got.state, JobState::kSucceeded) << got.failure;
  ASSERT_EQ(got.changes.size(), 1u);
  const PlanChange& c = got.changes[0];
  EXPECT_EQ(c.cause, PlanChange::Cause::kOutOfMemory);
  EXPECT_EQ(c.workers, 3);
  EXPECT_GT(c.stage_memory_cap, 0);
  EXPECT_NE(c.detail.find("recompute of stage slot"), std::string::npos) << c.detail;
  EXPECT_NE(c.detail.find("injected"), std::string::npos) << c.detail;
  ASSERT_FALSE(c.partition.empty()) << c.detail;
  EXPECT_NE(c.partition, clean.partitions[0]);
  // Nothing was lost: the device still works, every iteration ran on the three workers.
  EXPECT_EQ(got.workers, (std::vector<int>{3, 3, 3, 3}));
  // The re-plan applies from the first iteration dispatched after the fault was seen: in sync
  // mode iteration 2; in async mode iteration 2 may have been dispatched already.
  ASSERT_EQ(got.partitions.size(), static_cast<size_t>(kBatches));
  EXPECT_EQ(got.partitions[0], clean.partitions[0]);
  EXPECT_EQ(got.partitions[1], clean.partitions[1]);
  EXPECT_EQ(got.partitions[3], c.partition);
  size_t first_new = 2;
  if (mode == planning::OptimizerMode::kSync) {
    EXPECT_EQ(got.partitions[2], c.partition);
  } else if (got.partitions[2] != c.partition) {
    first_new = 3;
  }
  // Async: the switch to the new partition drains the pipeline once, so its first iteration runs
  // on the weights of every step before (not one behind): its loss differs from the clean run's.
  const size_t exact = mode == planning::OptimizerMode::kSync ? first_new : first_new - 1;
  for (size_t i = 0; i <= exact; ++i) {
    EXPECT_EQ(got.losses[i], clean.losses[i]) << "iteration " << i << "'s loss";
  }
  for (size_t i = exact + 1; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], clean.losses[i], 1e-3) << "iteration " << i << "'s loss";
  }
  for (const auto& [name, w] : clean.params) {
    const std::vector<float>& v = got.params.at(name);
    ASSERT_EQ(v.size(), w.size()) << name;
    // Within a few learning rates (1e-3): Adam's step is lr-sized whatever the gradient's size.
    for (size_t k = 0; k < w.size(); ++k) ASSERT_NEAR(v[k], w[k], 3e-3) << name << "[" << k << "]";
  }
}

TEST(LostWorker, AnOutOfMemorySlotIsRepeatedAndTheJobReplansSync) {
  ExpectOutOfMemoryReplans(planning::OptimizerMode::kSync);
}
TEST(LostWorker, AnOutOfMemorySlotIsRepeatedAndTheJobReplansAsync) {
  ExpectOutOfMemoryReplans(planning::OptimizerMode::kAsync);
}

// A slot that runs out of memory on every try fails its job with an error that says what to
// change, after kMaxOutOfMemoryRuns tries; nothing hangs and the engine runs the next job.
TEST(LostWorker, ASlotThatNeverFitsFailsTheJobSayingWhy) {
  std::atomic<int> fired{0};
  const workers::FaultHook hook = [&](int, const workers::OpInfo& op) {
    if (op.iteration != 1 || op.label != "B1 mb0") return workers::Fault::kNone;
    ++fired;
    return workers::Fault::kOutOfMemory;
  };
  workers::SetFaultHook(&hook);
  auto engine = Engine::Create({"cpu:3"});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  const JobSpec spec = LostWorkerJob(planning::OptimizerMode::kSync);
  auto id = e.Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  for (int b = 0; b < 3; ++b) {
    ASSERT_TRUE(e.FeedBatch(*id, rp::testing::ToBatch(RandomTokens(6, 8, spec.model.vocab, 500 + b))).ok());
  }
  ASSERT_TRUE(e.CloseInput(*id).ok());
  Outcome out;
  for (const JobEvent& ev : DrainUntilEnded(e, *id)) Record(ev, out);
  workers::SetFaultHook(nullptr);
  EXPECT_EQ(*e.State(*id), JobState::kFailed);
  EXPECT_EQ(fired.load(), 3);
  EXPECT_NE(out.failure.find("ran out of device memory 3 times"), std::string::npos) << out.failure;
  EXPECT_NE(out.failure.find("stage_memory_cap"), std::string::npos) << out.failure;
  auto next = e.Submit(TinyJob());
  ASSERT_TRUE(next.ok());
  const absl::Status fed = e.FeedBatch(*next, rp::testing::ToBatch(RandomTokens(6, 8, 41, 1)));
  ASSERT_TRUE(fed.ok()) << fed;
  ASSERT_TRUE(e.CloseInput(*next).ok());
  for (const JobEvent& ev : DrainUntilEnded(e, *next)) Record(ev, out);
  EXPECT_EQ(*e.State(*next), JobState::kSucceeded);
}

// A job whose partition was planned from measured times re-plans it for the workers left when
// one leaves the pool, and again when it comes back; each re-plan is an event of the job.
TEST(LostWorker, AMeasuredPartitionIsReplannedForTheWorkersLeftAndBack) {
  JobSpec spec = LostWorkerJob(planning::OptimizerMode::kSync);
  spec.partition.reset();
  spec.auto_partition = true;
  constexpr int kLong = 10;
  const Outcome got = scheduler::Run(spec, kLong, [](Engine& e, JobId id, int b, Outcome& out) {
    if (b == 6) {
      AwaitIterations(e, id, 6, out);
      ASSERT_TRUE(e.DrainWorker(1).ok());
    }
    if (b == 8) {
      AwaitIterations(e, id, 8, out);
      ASSERT_TRUE(e.EnableWorker(1).ok());
    }
  });
  ASSERT_EQ(got.state, JobState::kSucceeded) << got.failure;
  ASSERT_EQ(got.changes.size(), 2u);
  EXPECT_EQ(got.changes[0].cause, PlanChange::Cause::kWorkerDrained);
  EXPECT_EQ(got.changes[0].workers, 2);
  EXPECT_FALSE(got.changes[0].partition.empty()) << got.changes[0].detail;
  EXPECT_NE(got.changes[0].detail.find("re-planned for 2 workers"), std::string::npos) << got.changes[0].detail;
  EXPECT_EQ(got.changes[1].cause, PlanChange::Cause::kWorkerReturned);
  EXPECT_EQ(got.changes[1].workers, 3);
  EXPECT_NE(got.changes[1].detail.find("re-planned for 3 workers"), std::string::npos) << got.changes[1].detail;
  ASSERT_EQ(got.partitions.size(), static_cast<size_t>(kLong));
  EXPECT_EQ(got.partitions[6], got.changes[0].partition);
  EXPECT_EQ(got.partitions[8], got.changes[1].partition);
  EXPECT_EQ(got.workers[6], 2);
  EXPECT_EQ(got.workers[8], 3);
}

TEST(LostWorker, AnOperatorCannotEmptyThePoolOrNameAWorkerThatIsNot) {
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  EXPECT_EQ(e.DrainWorker(2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(e.DrainWorker(-1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(e.EnableWorker(5).code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE(e.DrainWorker(0).ok());
  ASSERT_TRUE(e.DrainWorker(0).ok());  // already out: nothing changes
  const absl::Status last = e.DrainWorker(1, /*now=*/true);
  EXPECT_EQ(last.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(last.message().find("last usable"), std::string_view::npos) << last;
  EXPECT_EQ(e.Stats().devices[1].state, DeviceStats::State::kUp);
  ASSERT_TRUE(e.EnableWorker(0).ok());
  EXPECT_TRUE(e.DrainWorker(1, /*now=*/true).ok());
  EXPECT_EQ(e.Stats().devices[1].state, DeviceStats::State::kLost);
  // A job still runs on the one left and succeeds.
  auto id = e.Submit(TinyJob());
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(e.FeedBatch(*id, rp::testing::ToBatch(RandomTokens(4, 8, 41, 1))).ok());
  ASSERT_TRUE(e.CloseInput(*id).ok());
  Outcome out;
  for (const JobEvent& ev : DrainUntilEnded(e, *id)) Record(ev, out);
  EXPECT_EQ(*e.State(*id), JobState::kSucceeded) << out.failure;
  EXPECT_EQ(out.workers, std::vector<int>{1});
}

}  // namespace
}  // namespace rp::scheduler
