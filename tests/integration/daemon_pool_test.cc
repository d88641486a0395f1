// The daemon's worker pool (DaemonConfig.maxRunningJobs): a job runs and finishes beside one
// that waits for its stream; a job beyond the limit waits and says why in GetJob, WatchJob and
// `roundpipe ls`, behind a higher-priority job too; it starts once a slot is free.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

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
  // (The record changes with the event; the stream delivers it a moment later: wait for it.)
  bool told = false;
  for (int i = 0; i < 200 && !told; ++i) {
    for (const v1::JobEvent& ev : wd.Events()) told |= ev.has_waiting() && ev.waiting().cause() == v1::JobWait::BEHIND;
    if (!told) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
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

// A running job sees a worker leave and come back as WatchJob events (PlanChange), each before
// the step that ran with it, and goes on training through both; GetServerInfo and `roundpipe
// info` show its compute per worker (none on the drained one meanwhile).
TEST_F(DaemonPoolTest, AJobSeesAWorkerLeaveAndReturnAsEvents) {
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.set_max_steps(0);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(c->StreamBatches(job->id(), {TinyBatch(job->id(), 1, /*keep_open=*/true)}).ok());
  ASSERT_TRUE(w.WaitForSteps(1)) << daemon_.Output();
  // GetServerInfo: the job's compute on each worker (step 1 ran on both).
  auto compute_on = [&]() {
    auto info = c->Info();
    std::vector<double> per_worker;
    if (info.ok() && info->running_jobs_size() == 1) {
      per_worker.assign(info->running_jobs(0).worker_compute_seconds().begin(),
                        info->running_jobs(0).worker_compute_seconds().end());
    }
    return per_worker;
  };
  const std::vector<double> after_one = compute_on();
  ASSERT_EQ(after_one.size(), 2u);
  EXPECT_GT(after_one[0], 0);
  EXPECT_GT(after_one[1], 0);
  std::string out;
  const std::string cli = std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address();
  EXPECT_EQ(RunCommand(cli + " info", &out), 0) << out;
  EXPECT_NE(out.find("running 1 of at most 1 job(s)"), std::string::npos) << out;
  EXPECT_NE(out.find(job->id() + " share 1: compute"), std::string::npos) << out;
  ASSERT_TRUE(c->DrainWorker(1, /*now=*/false).ok());
  ASSERT_TRUE(c->StreamBatches(job->id(), {TinyBatch(job->id(), 2, /*keep_open=*/true)}).ok());
  ASSERT_TRUE(w.WaitForSteps(2)) << daemon_.Output();
  // Step 2 ran on worker 0 alone: nothing more on the drained worker 1.
  const std::vector<double> after_two = compute_on();
  ASSERT_EQ(after_two.size(), 2u);
  EXPECT_GT(after_two[0], after_one[0]);
  EXPECT_EQ(after_two[1], after_one[1]);
  ASSERT_TRUE(c->EnableWorker(1).ok());
  ASSERT_TRUE(c->StreamBatches(job->id(), {TinyBatch(job->id(), 3)}).ok());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  std::vector<v1::PlanChange> changes;
  std::vector<int64_t> step_after;  // the step that followed each change
  int64_t steps = 0;
  for (const v1::JobEvent& e : w.Events()) {
    if (e.has_step()) {
      ++steps;
      if (step_after.size() < changes.size()) step_after.push_back(e.step().step());
    }
    if (e.has_plan_change()) {
      changes.push_back(e.plan_change());
      EXPECT_FALSE(e.message().empty());
    }
  }
  EXPECT_EQ(steps, 3);
  ASSERT_EQ(changes.size(), 2u) << daemon_.Output();
  EXPECT_EQ(changes[0].cause(), v1::PlanChange::WORKER_DRAINED);
  EXPECT_EQ(changes[0].worker(), 1);
  EXPECT_EQ(changes[0].workers(), 1);
  EXPECT_EQ(changes[1].cause(), v1::PlanChange::WORKER_RETURNED);
  EXPECT_EQ(changes[1].worker(), 1);
  EXPECT_EQ(changes[1].workers(), 2);
  EXPECT_EQ(step_after, (std::vector<int64_t>{2, 3}));
  EXPECT_NE(daemon_.Output().find("worker drained (worker 1): drained by an operator"), std::string::npos)
      << daemon_.Output();
}

// A model whose states take tens of MB (fp32, AdamW): three of them are "large" next to a
// host-memory limit that holds two and a half.
v1::JobSpec LargeSpec() {
  v1::JobSpec s = TinyJobSpec();
  auto* m = s.mutable_model();
  m->set_hidden(256);
  m->set_intermediate(512);
  m->set_num_blocks(4);
  m->set_num_heads(4);
  m->set_num_kv_heads(2);
  m->set_head_dim(64);
  s.set_max_steps(3);
  return s;
}

// Three LargeSpec jobs submitted at once to a fresh daemon with `config` (JSON): how much its
// RSS grew at its peak over the RSS after a small warm-up job (so what any first job sets up is in
// the baseline), its output, and the three jobs' ids.
struct ThreeJobs {
  int64_t grew_bytes = -1;
  std::string output;
  std::vector<std::string> ids;
  std::vector<int64_t> started_ns, ended_ns;
};
ThreeJobs RunThree(const std::string& dir, const std::string& data_root, const std::string& tokens,
                   const std::string& config_json) {
  ThreeJobs out;
  const std::string config = dir + ".json";
  std::ofstream(config) << config_json;
  DaemonProcess d;
  if (!d.Start(dir, {"--allowed_root", data_root, "--config", config})) {
    out.output = d.Output();
    return out;
  }
  auto c = d.Connect();
  v1::JobSpec warm = TinyJobSpec();
  warm.mutable_data()->mutable_token_file()->set_path(tokens);
  warm.set_max_steps(2);
  auto wj = c->Submit(warm);
  if (!wj.ok()) return out;
  {
    Watcher w(*c, wj->id());
    if (!w.WaitForState(v1::JOB_STATE_SUCCEEDED)) return out;
  }
  const int64_t baseline_kib = ProcStatusField(d.pid(), "VmRSS:");
  std::vector<std::unique_ptr<Watcher>> watchers;
  for (int i = 0; i < 3; ++i) {
    v1::JobSpec s = LargeSpec();
    s.mutable_data()->mutable_token_file()->set_path(tokens);
    auto j = c->Submit(s);
    if (!j.ok()) return out;
    out.ids.push_back(j->id());
    watchers.push_back(std::make_unique<Watcher>(*c, j->id()));
  }
  for (auto& w : watchers) {
    if (!w->WaitForState(v1::JOB_STATE_SUCCEEDED)) return out;
    out.started_ns.push_back(w->TimeOf(v1::JOB_STATE_RUNNING));
    out.ended_ns.push_back(w->TimeOf(v1::JOB_STATE_SUCCEEDED));
  }
  out.grew_bytes = (ProcStatusField(d.pid(), "VmHWM:") - baseline_kib) * 1024;
  out.output = d.Output();
  return out;
}

// Admission under DaemonConfig.hostMemoryLimitBytes: three jobs submitted at once that do not fit
// together under the limit run two at a time — the one left waiting says it waits for host
// memory, and starts when a running one ends — and the daemon's peak RSS stays within the limit;
// the same three jobs on a daemon without the limit, side by side, exceed it.
TEST_F(DaemonPoolTest, ThreeJobsTooLargeTogetherStayWithinTheHostMemoryLimit) {
  const std::string tokens = TokenFile(20000);
  int64_t one = 0;  // one job's predicted model states, from a daemon without a limit
  {
    DaemonProcess probe;
    ASSERT_TRUE(probe.Start(root_ + "/probe", {"--allowed_root", root_ + "/data"})) << probe.Output();
    auto c = probe.Connect();
    v1::JobSpec s = LargeSpec();
    s.set_max_steps(0);  // waits for a stream: never trains
    auto job = c->Submit(s);
    ASSERT_TRUE(job.ok()) << job.status();
    const v1::HostMemory mem = c->Get(job->id())->host_memory();
    EXPECT_GT(mem.predicted_worker_bytes(), 0);  // CPU workers: their stage copies are host memory
    one = mem.predicted_state_bytes() + mem.predicted_worker_bytes();
    ASSERT_TRUE(c->Cancel(job->id()).ok());
  }
  ASSERT_GT(one, 20 << 20);
  const int64_t limit = one * 5 / 2;
  const std::string limited = "{\"maxRunningJobs\": 3, \"hostMemoryLimitBytes\": " + std::to_string(limit) + "}";
  {  // a job too large for the limit on its own is refused, naming the limit
    const std::string config = root_ + "/huge.json";
    std::ofstream(config) << limited;
    ASSERT_TRUE(StartDaemon({"--config", config})) << daemon_.Output();
    v1::JobSpec huge = LargeSpec();
    huge.mutable_model()->set_num_blocks(16);
    auto refused = daemon_.Connect()->Submit(huge);
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
    EXPECT_NE(refused.status().message().find("hostMemoryLimitBytes"), std::string::npos) << refused.status();
  }
  const ThreeJobs with = RunThree(root_ + "/limited", root_ + "/data", tokens, limited);
  const ThreeJobs without = RunThree(root_ + "/free", root_ + "/data", tokens, "{\"maxRunningJobs\": 3}");
  ASSERT_GT(with.grew_bytes, 0) << with.output;
  ASSERT_GT(without.grew_bytes, 0) << without.output;
  std::printf(
      "one job's predicted states and CPU stage copies %.1f MiB, limit %.1f MiB; the daemon's peak RSS grew by %.1f "
      "MiB with the "
      "limit, %.1f MiB without (three at once)\n",
      static_cast<double>(one) / (1 << 20), static_cast<double>(limit) / (1 << 20),
      static_cast<double>(with.grew_bytes) / (1 << 20), static_cast<double>(without.grew_bytes) / (1 << 20));
  // With the limit two ran together and the daemon never held more than the limit; without it,
  // the three ran at once, over it.
  EXPECT_LE(with.grew_bytes, limit);
  EXPECT_GT(without.grew_bytes, limit);
  // The third waited for host memory while the first two ran, and started once one ended.
  EXPECT_NE(with.output.find("[" + with.ids[2] + "] waits for host memory: needs "), std::string::npos) << with.output;
  EXPECT_NE(with.output.find(with.ids[0] + ", " + with.ids[1] + " run"), std::string::npos) << with.output;
  EXPECT_GE(with.started_ns[2], std::min(with.ended_ns[0], with.ended_ns[1]));
  EXPECT_LT(without.started_ns[2], std::min(without.ended_ns[0], without.ended_ns[1]));
}

}  // namespace
}  // namespace rp::testing
