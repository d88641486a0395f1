// The pump's two pure parts: engine events applied to a job's record (JobEventTracker) and the
// engine's cumulative counters turned into metric increments (EngineMetrics).
#include "server/job_events.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "server/engine_metrics.h"

namespace rp::server {
namespace {

namespace v1 = roundpipe::v1;
using scheduler::JobEvent;
using scheduler::JobState;
using Clock = std::chrono::steady_clock;

JobEvent State(JobState s, std::string why = "") {
  JobEvent e;
  e.kind = JobEvent::Kind::kState;
  e.state = s;
  e.message = std::move(why);
  e.time = std::chrono::system_clock::now();
  return e;
}

JobEvent Step(double loss, double seconds, int64_t tokens = 64) {
  JobEvent e;
  e.kind = JobEvent::Kind::kIteration;
  e.stats.loss = loss;
  e.stats.seconds = seconds;
  e.stats.tokens = tokens;
  e.stats.partition = "F[2] B1[2]";
  return e;
}

JobEvent Other(JobEvent::Kind kind, std::string message) {
  JobEvent e;
  e.kind = kind;
  e.message = std::move(message);
  return e;
}

TEST(JobEventTracker, StatesMessagesAndTransitions) {
  JobEventTracker t;
  v1::Job rec;
  rec.set_state(v1::JOB_STATE_QUEUED);
  const auto now = Clock::now();
  auto fx = t.Apply(Other(JobEvent::Kind::kProgress, "allocating the host model store"), now, false, &rec);
  EXPECT_EQ(fx.out.progress(), "allocating the host model store");
  EXPECT_EQ(rec.message(), "allocating the host model store");
  fx = t.Apply(State(JobState::kRunning), now, false, &rec);
  EXPECT_EQ(fx.from, v1::JOB_STATE_QUEUED);
  EXPECT_EQ(fx.to, v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(rec.has_started());
  EXPECT_TRUE(fx.persist);
  EXPECT_FALSE(fx.ended);
  // The engine paused it itself: the reason stays (the event says who paused, never its wording);
  // a caller's pause says "paused" or the engine's detail; a drain says so.
  JobEvent self = State(JobState::kPaused, "paused after 3 checkpoints in a row failed");
  self.pause_cause = JobEvent::PauseCause::kByEngine;
  fx = t.Apply(self, now, false, &rec);
  EXPECT_EQ(rec.message(), "paused after 3 checkpoints in a row failed");
  EXPECT_FALSE(rec.paused_by_drain());
  fx = t.Apply(State(JobState::kPaused), now, false, &rec);
  EXPECT_EQ(rec.message(), "paused");
  EXPECT_FALSE(rec.paused_by_drain());
  fx = t.Apply(State(JobState::kPaused, "paused while starting; it starts again on resume"), now, false, &rec);
  EXPECT_EQ(rec.message(), "paused while starting; it starts again on resume");
  fx = t.Apply(State(JobState::kPaused, "paused before it started"), now, true, &rec);
  EXPECT_EQ(rec.message(), "paused by a daemon drain");
  EXPECT_TRUE(rec.paused_by_drain());  // what a restart reads (never the message)
  // A profile written is recorded; one that failed is a warning and never taken for a path,
  // whatever its wording.
  fx = t.Apply(Other(JobEvent::Kind::kProfile, "could not-really/profile.json"), now, false, &rec);
  EXPECT_EQ(rec.profile(), "could not-really/profile.json");
  EXPECT_EQ(fx.log, EventEffect::Log::kInfo);
  fx = t.Apply(Other(JobEvent::Kind::kProfileFailed, "disk full"), now, false, &rec);
  EXPECT_EQ(rec.profile(), "could not-really/profile.json");
  EXPECT_EQ(fx.log, EventEffect::Log::kWarn);
  fx = t.Apply(State(JobState::kRunning), now, false, &rec);
  EXPECT_TRUE(rec.message().empty());
  EXPECT_FALSE(rec.paused_by_drain());
  // A checkpoint failure is counted and named in the final message.
  fx = t.Apply(Other(JobEvent::Kind::kCheckpointFailed, "checkpoint at step 4 failed: disk full"), now, false, &rec);
  EXPECT_EQ(fx.out.checkpoint_failed(), "checkpoint at step 4 failed: disk full");
  EXPECT_EQ(fx.log, EventEffect::Log::kError);
  EXPECT_EQ(t.checkpoint_failures(), 1);
  fx = t.Apply(State(JobState::kSucceeded), now, false, &rec);
  EXPECT_TRUE(fx.ended);
  EXPECT_EQ(rec.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_NE(rec.message().find("succeeded, but 1 checkpoint(s) failed (last: checkpoint at step 4 failed: disk full)"),
            std::string::npos)
      << rec.message();
  v1::Job failed;
  fx = JobEventTracker().Apply(State(JobState::kFailed, "training diverged at step 3"), now, false, &failed);
  EXPECT_EQ(failed.error(), "training diverged at step 3");
  EXPECT_TRUE(fx.ended);
}

TEST(JobEventTracker, StepsCountTokensEstimateTheEndAndPersistAtMostOnceASecond) {
  JobEventTracker t;
  v1::Job rec;
  rec.set_total_steps(10);
  (void)t.Apply(Other(JobEvent::Kind::kProgress, "loading weights from /m"), Clock::now(), false, &rec);
  const auto t0 = Clock::now();
  auto fx = t.Apply(Step(5.0, 0.5), t0, false, &rec);
  EXPECT_TRUE(rec.message().empty()) << "the first step ends the loading message";
  EXPECT_TRUE(fx.persist);
  EXPECT_EQ(fx.out.step().step(), 1);
  EXPECT_DOUBLE_EQ(fx.out.step().tokens_per_second(), 128);
  EXPECT_DOUBLE_EQ(fx.out.step().eta_seconds(), 9 * 0.5);  // the first step's own time
  fx = t.Apply(Step(4.0, 0.5), t0 + std::chrono::milliseconds(200), false, &rec);
  EXPECT_FALSE(fx.persist) << "steps within a second are not each written";
  EXPECT_NEAR(fx.out.step().eta_seconds(), 8 * (0.8 * 0.5 + 0.2 * 0.2), 1e-9);
  fx = t.Apply(Step(3.0, 0.5), t0 + std::chrono::milliseconds(1300), false, &rec);
  EXPECT_TRUE(fx.persist);
  EXPECT_EQ(rec.progress().step(), 3);
  EXPECT_EQ(rec.progress().tokens(), 3 * 64);
  EXPECT_DOUBLE_EQ(rec.progress().last_loss(), 3.0);
  EXPECT_EQ(rec.partition(), "F[2] B1[2]");
  v1::Job open;
  fx = JobEventTracker().Apply(Step(1.0, 1.0), t0, false, &open);
  EXPECT_EQ(fx.out.step().eta_seconds(), -1) << "unknown length";
}

TEST(EngineMetrics, CumulativeEngineCountersBecomeIncrementsOnce) {
  prometheus::Registry registry;
  DaemonMetrics m(registry);
  EngineMetrics em(&m);
  scheduler::EngineStats es;
  es.devices.resize(1);
  es.devices[0].name = "cpu:0";
  es.devices[0].param_up_bytes = 1000;
  std::vector<scheduler::OpRecord> ops = {{0, "compute", "F s0 mb0", 0, 0, 0, 0.0, 0.25}};
  scheduler::IterationStats st;
  st.tokens = 64;
  st.seconds = 0.5;
  em.RecordIteration(st, es, ops);
  es.devices[0].param_up_bytes = 1500;  // +500
  ops.push_back({0, "compute", "F s0 mb1", 1, 0, 1, 0.25, 0.75});
  em.RecordIteration(st, es, ops);  // the first op ended before what was seen: not again
  EXPECT_DOUBLE_EQ(m.transfer_bytes.Add({{"direction", "host_to_device"}, {"kind", "parameter"}}).Value(), 1500);
  EXPECT_DOUBLE_EQ(m.worker_busy.Add({{"worker", "0"}, {"stream", "compute"}}).Value(), 0.75);
  EXPECT_DOUBLE_EQ(m.tokens_trained.Value(), 128);
  EXPECT_DOUBLE_EQ(m.iterations.Value(), 2);
  EXPECT_DOUBLE_EQ(em.seen_until(), 0.75);
}

}  // namespace
}  // namespace rp::server

namespace rp::server {
namespace {

// A queued job's wait, from the engine's ids to the daemon's, in the record and in words.
TEST(JobEventTracker, AWaitNamesTheOtherJobsAndIsForgottenOnceTheJobRuns) {
  JobEventTracker t;
  t.set_names([](scheduler::JobId id) { return absl::StrCat("job-00000", id); });
  v1::Job rec;
  rec.set_state(v1::JOB_STATE_QUEUED);
  JobEvent e;
  e.kind = JobEvent::Kind::kWaiting;
  e.state = JobState::kQueued;
  e.wait.cause = scheduler::JobWait::Cause::kHostMemory;
  e.wait.running = {7};
  e.wait.need_bytes = int64_t{41} << 30;
  e.wait.free_bytes = int64_t{25} << 29;
  auto fx = t.Apply(e, Clock::now(), false, &rec);
  EXPECT_EQ(rec.message(), "waits for host memory: needs 41.0 GiB, 12.5 GiB free while job-000007 runs");
  EXPECT_EQ(rec.waiting().cause(), v1::JobWait::HOST_MEMORY);
  EXPECT_EQ(fx.out.waiting().running_jobs(0), "job-000007");
  EXPECT_EQ(fx.out.message(), rec.message());
  EXPECT_TRUE(fx.persist);
  e.wait = {};
  e.wait.cause = scheduler::JobWait::Cause::kRunningLimit;
  e.wait.running = {7, 8};
  e.wait.max_running = 2;
  t.Apply(e, Clock::now(), false, &rec);
  EXPECT_EQ(rec.message(), "waits for a running slot: job-000007, job-000008 run (maxRunningJobs 2)");
  e.wait = {};
  e.wait.cause = scheduler::JobWait::Cause::kBehind;
  e.wait.ahead = 9;
  e.wait.ahead_priority = 5;
  t.Apply(e, Clock::now(), false, &rec);
  EXPECT_EQ(rec.message(), "waits behind job-000009 (priority 5)");
  EXPECT_EQ(rec.waiting().ahead_job(), "job-000009");
  t.Apply(State(JobState::kRunning), Clock::now(), false, &rec);
  EXPECT_FALSE(rec.has_waiting());
  EXPECT_TRUE(rec.message().empty());
  // Without names (a tracker nobody told): the engine's id, never a crash.
  v1::Job other;
  JobEventTracker().Apply(e, Clock::now(), false, &other);
  EXPECT_EQ(other.message(), "waits behind engine job 9 (priority 5)");
}

// A plan change (a worker lost, drained or back; a device out-of-memory re-plan) reaches watchers
// as its own event with the cause and what was re-planned, and the record's partition follows.
TEST(JobEvents, APlanChangeIsAnEventAndMovesThePartition) {
  JobEventTracker t;
  v1::Job rec;
  rec.set_state(v1::JOB_STATE_RUNNING);
  rec.set_partition("F[2,2] B1=2 B[2,2]");
  JobEvent e;
  e.kind = JobEvent::Kind::kPlanChange;
  e.state = JobState::kRunning;
  e.plan_change.cause = scheduler::PlanChange::Cause::kOutOfMemory;
  e.plan_change.workers = 3;
  e.plan_change.partition = "F[1,1,1] B1=1 B[1,1]";
  e.plan_change.stage_memory_cap = 1234;
  e.plan_change.detail = "recompute of stage slot 3 (layers 2..3) on cpu:1: out of memory";
  auto fx = t.Apply(e, Clock::now(), false, &rec);
  ASSERT_TRUE(fx.out.has_plan_change());
  EXPECT_EQ(fx.out.plan_change().cause(), v1::PlanChange::DEVICE_OUT_OF_MEMORY);
  EXPECT_EQ(fx.out.plan_change().worker(), -1);
  EXPECT_EQ(fx.out.plan_change().workers(), 3);
  EXPECT_EQ(fx.out.plan_change().stage_memory_cap(), 1234);
  EXPECT_EQ(fx.out.message(), e.plan_change.detail);
  EXPECT_EQ(rec.partition(), "F[1,1,1] B1=1 B[1,1]");
  EXPECT_EQ(fx.log, EventEffect::Log::kWarn);
  EXPECT_EQ(fx.log_line, "device out of memory: " + e.plan_change.detail);
  e.plan_change = {};
  e.plan_change.cause = scheduler::PlanChange::Cause::kWorkerReturned;
  e.plan_change.worker = 1;
  e.plan_change.workers = 2;
  e.plan_change.detail = "back in the pool";
  fx = t.Apply(e, Clock::now(), false, &rec);
  EXPECT_EQ(fx.out.plan_change().cause(), v1::PlanChange::WORKER_RETURNED);
  EXPECT_EQ(rec.partition(), "F[1,1,1] B1=1 B[1,1]");  // unchanged: nothing re-planned
  EXPECT_EQ(fx.log, EventEffect::Log::kInfo);
  EXPECT_EQ(fx.log_line, "worker returned (worker 1): back in the pool");
}

}  // namespace
}  // namespace rp::server
