// The daemon's worker pool (DaemonConfig.maxRunningJobs): a job runs and finishes beside one
// that waits for its stream; a job beyond the limit waits and says why in GetJob, WatchJob and
// `roundpipe ls`, behind a higher-priority job too; it starts once a slot is free.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/integration/daemon_process.h"
#include "tests/integration/fixtures.h"
#include "tests/support/run_command.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;

class DaemonPoolTest : public DaemonTest {
 protected:
  bool StartWithTwoSlots() {
    const std::string config = root_ + "/roundpiped.json";
    std::ofstream(config) << R"({"maxRunningJobs": 2})";
    return StartDaemon({"--config", config});
  }
};

TEST_F(DaemonPoolTest, JobsRunSideBySideAndAQueuedOneSaysWhatItWaitsFor) {
  ASSERT_TRUE(StartWithTwoSlots()) << daemon_.Output();
  auto c = daemon_.Connect();
  // A waits for its stream (RUNNING throughout); B, from a token file, runs and ends beside it.
  v1::JobSpec a = TinySpec();
  a.set_max_steps(0);
  auto ja = c->Submit(a);
  ASSERT_TRUE(ja.ok()) << ja.status();
  Watcher wa(*c, ja->id());
  ASSERT_TRUE(wa.WaitForState(v1::JOB_STATE_RUNNING));
  v1::JobSpec b = TinySpec();
  b.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  b.set_max_steps(3);
  b.set_share(2);
  auto jb = c->Submit(b);
  ASSERT_TRUE(jb.ok()) << jb.status();
  Watcher wb(*c, jb->id());
  ASSERT_TRUE(wb.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  EXPECT_EQ(c->Get(ja->id())->state(), v1::JOB_STATE_RUNNING);
  // GetServerInfo: the pool's size and who runs on it (A: it has computed nothing, no batch yet).
  // (B leaves the pool once its runner has released it, just after its last event.)
  auto info = c->Info();
  for (int i = 0; i < 200 && info.ok() && info->running_jobs_size() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    info = c->Info();
  }
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->max_running_jobs(), 2);
  ASSERT_EQ(info->running_jobs_size(), 1);
  EXPECT_EQ(info->running_jobs(0).job_id(), ja->id());
  EXPECT_EQ(info->running_jobs(0).share(), 1);
  EXPECT_EQ(c->Get(jb->id())->progress().step(), 3);

  // C takes the second slot; D waits for a slot, then behind E (priority 5).
  v1::JobSpec streamed = TinySpec();
  streamed.set_max_steps(0);
  auto jc = c->Submit(streamed);
  ASSERT_TRUE(jc.ok());
  Watcher wc(*c, jc->id());
  ASSERT_TRUE(wc.WaitForState(v1::JOB_STATE_RUNNING));
  auto jd = c->Submit(b);
  ASSERT_TRUE(jd.ok());
  Watcher wd(*c, jd->id());
  ASSERT_TRUE(WaitForRecord(
      *c, jd->id(), [](const v1::Job& j) { return j.waiting().cause() == v1::JobWait::RUNNING_LIMIT; },
      std::chrono::seconds(30)));
  v1::Job d = *c->Get(jd->id());
  EXPECT_EQ(d.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(d.waiting().max_running_jobs(), 2);
  EXPECT_EQ(std::vector<std::string>(d.waiting().running_jobs().begin(), d.waiting().running_jobs().end()),
            (std::vector<std::string>{ja->id(), jc->id()}));
  EXPECT_EQ(d.message(), "waits for a running slot: " + ja->id() + ", " + jc->id() + " run (maxRunningJobs 2)");
  v1::JobSpec e = b;
  e.set_priority(5);
  auto je = c->Submit(e);
  ASSERT_TRUE(je.ok());
  ASSERT_TRUE(WaitForRecord(
      *c, jd->id(), [](const v1::Job& j) { return j.waiting().cause() == v1::JobWait::BEHIND; },
      std::chrono::seconds(30)));
  d = *c->Get(jd->id());
  EXPECT_EQ(d.waiting().ahead_job(), je->id());
  EXPECT_EQ(d.message(), "waits behind " + je->id() + " (priority 5)");
  // `roundpipe ls` shows it; WatchJob told it as events.
  std::string ls;
  ASSERT_EQ(RunCommand(std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address() + " ls", &ls), 0) << ls;
  EXPECT_NE(ls.find("waits behind " + je->id()), std::string::npos) << ls;
  bool told = false;
  for (const v1::JobEvent& ev : wd.Events()) told |= ev.has_waiting() && ev.waiting().cause() == v1::JobWait::BEHIND;
  EXPECT_TRUE(told);

  // C ends: E takes its slot, then D once E is done; the record forgets the wait once it runs.
  ASSERT_TRUE(c->Cancel(jc->id()).ok());
  Watcher we(*c, je->id());
  ASSERT_TRUE(we.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  ASSERT_TRUE(wd.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  EXPECT_LT(we.TimeOf(v1::JOB_STATE_SUCCEEDED), wd.TimeOf(v1::JOB_STATE_RUNNING));
  EXPECT_FALSE(c->Get(jd->id())->has_waiting());
  ASSERT_TRUE(c->Cancel(ja->id()).ok());
}

// An operator takes a worker out and puts it back over AdminService and `roundpipe worker`: the
// state shows in GetServerInfo and `roundpipe info`; a job runs on what is left; the last usable
// worker cannot be drained; a worker drained at once is "lost" with the reason, and comes back.
TEST_F(DaemonPoolTest, AnOperatorDrainsAndEnablesWorkers) {
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto c = daemon_.Connect();
  const std::string cli = std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address();
  auto info = c->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->devices_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(info->devices(i).worker(), i);
    EXPECT_EQ(info->devices(i).state(), "up");
  }
  EXPECT_EQ(c->DrainWorker(2, false).status().code(), absl::StatusCode::kOutOfRange);
  std::string out;
  EXPECT_EQ(RunCommand(cli + " worker drain 1", &out), 0) << out;
  EXPECT_NE(out.find("worker 1 (cpu:1): drained"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(cli + " info", &out), 0) << out;
  EXPECT_NE(out.find("1 cpu:1    drained"), std::string::npos) << out;
  // The last usable worker stays: refused, naming what to do.
  EXPECT_EQ(RunCommand(cli + " worker drain 0 --now", &out), 3) << out;
  EXPECT_NE(out.find("last usable one in the pool"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(cli + " worker enable 0 --now", &out), 2) << out;  // --now is drain's

  // A job runs and ends on worker 0 alone.
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  spec.set_max_steps(2);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();

  EXPECT_EQ(RunCommand(cli + " worker enable 1", &out), 0) << out;
  EXPECT_NE(out.find("worker 1 (cpu:1): up"), std::string::npos) << out;
  auto lost = c->DrainWorker(1, /*now=*/true);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->state(), "lost");
  // The metrics say so too (refreshed at each scrape).
  const std::string text = HttpGet(daemon_.metrics_address(), "/metrics");
  EXPECT_EQ(MetricValue(text, "roundpipe_worker_state{device=\"cpu:1\",state=\"lost\"}"), 1) << text;
  EXPECT_EQ(MetricValue(text, "roundpipe_worker_state{device=\"cpu:1\",state=\"up\"}"), 0);
  EXPECT_EQ(MetricValue(text, "roundpipe_worker_state{device=\"cpu:0\",state=\"up\"}"), 1);
  EXPECT_NE(lost->lost_reason().find("cpu:1 drained at once by an operator"), std::string::npos) << lost->lost_reason();
  auto back = c->EnableWorker(1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->state(), "up");
  EXPECT_EQ(back->lost_reason(), "");
}

}  // namespace
}  // namespace rp::testing
