// The daemon as a process (ARCHITECTURE §6): a restart lists every job and re-admits the queued
// ones, systemd's notify protocol (ready, watchdog, stopping), and a job killed with SIGKILL
// resumes from its checkpoint bit-identically.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <thread>

#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"
#include "tests/integration/fixtures.h"
#include "tests/support/reference_model.h"
#include "tests/support/tensorboard_reader.h"
#include "workers/io/safetensors_reader.h"
#include "workers/io/safetensors_writer.h"
#include "workers/store/host_model_store.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;
using namespace std::chrono_literals;

TEST_F(DaemonTest, RestartListsEveryJobAndReadmitsQueuedOnes) {
  ASSERT_TRUE(StartDaemon());
  std::string done_id, cancelled_id, running_id, queued_id;
  {
    auto c = daemon_.Connect();
    v1::JobSpec quick = TinySpec();
    quick.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
    quick.set_max_steps(2);
    auto done = c->Submit(quick);
    ASSERT_TRUE(done.ok());
    done_id = done->id();
    Watcher wd(*c, done_id);
    ASSERT_TRUE(wd.WaitForState(v1::JOB_STATE_SUCCEEDED));
    v1::JobSpec streamed = TinySpec();
    streamed.set_max_steps(0);
    auto running = c->Submit(streamed);  // runs, waiting for batches
    ASSERT_TRUE(running.ok());
    running_id = running->id();
    Watcher wr(*c, running_id);
    ASSERT_TRUE(wr.WaitForState(v1::JOB_STATE_RUNNING));
    auto queued = c->Submit(quick);  // waits behind it
    ASSERT_TRUE(queued.ok());
    queued_id = queued->id();
    auto to_cancel = c->Submit(quick);
    ASSERT_TRUE(to_cancel.ok());
    cancelled_id = to_cancel->id();
    ASSERT_TRUE(c->Cancel(cancelled_id).ok());
  }
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Output();  // SIGTERM: drain, pause, exit 0
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto c = daemon_.Connect();
  auto jobs = c->List();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  std::map<std::string, v1::Job> by_id;
  for (const auto& j : *jobs) by_id[j.id()] = j;
  ASSERT_EQ(by_id.size(), 4u);
  EXPECT_EQ(by_id[done_id].state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(by_id[done_id].progress().step(), 2);
  EXPECT_EQ(by_id[cancelled_id].state(), v1::JOB_STATE_CANCELLED);
  // The running job was paused and checkpointed by the drain: it continues (waiting for data).
  EXPECT_NE(by_id[running_id].state(), v1::JOB_STATE_PAUSED);
  EXPECT_NE(daemon_.Output().find("[" + running_id + "] resumed from"), std::string::npos);
  EXPECT_FALSE(by_id[running_id].last_checkpoint().empty());
  // The job that never started is admitted again and runs to completion.
  Watcher wq(*c, queued_id);
  ASSERT_TRUE(wq.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  // New ids continue after the old ones.
  v1::JobSpec quick = TinySpec();
  quick.set_max_steps(1);
  auto fresh = c->Submit(quick);
  ASSERT_TRUE(fresh.ok());
  EXPECT_GT(fresh->id(), queued_id);
}

// systemd's notify protocol, with the test in systemd's place: a datagram socket named by
// NOTIFY_SOCKET receives READY=1, WATCHDOG=1 pings (WATCHDOG_USEC) and STOPPING=1 on SIGTERM.
TEST_F(DaemonTest, NotifiesSystemdReadyWatchdogAndStopping) {
  const std::string path = root_ + "/notify.sock";
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ASSERT_TRUE(StartDaemon({}, {{"NOTIFY_SOCKET", path}, {"WATCHDOG_USEC", "200000"}}));
  auto receive = [&](const std::string& want) {
    char buf[1024];
    for (int i = 0; i < 50; ++i) {
      const ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);  // blocks until the daemon sends
      if (n <= 0) return false;
      if (std::string(buf, static_cast<size_t>(n)).find(want) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(receive("READY=1"));
  EXPECT_TRUE(receive("WATCHDOG=1"));
  EXPECT_TRUE(receive("WATCHDOG=1"));
  kill(daemon_.pid(), SIGTERM);
  EXPECT_TRUE(receive("STOPPING=1"));
  EXPECT_EQ(daemon_.Stop(), 0);
  close(fd);
}

// The TensorBoard files (issue: what a fine-tuner looks at) of a job killed and resumed, against
// the same job run straight: every step once in the killed job's files, across the SIGKILL and the
// restart, and each series equal to the job's metrics step for step, as float as TensorBoard keeps
// them. Loss, learning rate and gradient norm equal the straight run's WatchJob metrics (the
// training is bit-identical); the timing series equal each job's own events.
void ExpectTensorBoardMatchesTheMetrics(const std::string& jobs_dir, const std::string& killed_id,
                                        const std::string& straight_id, const std::vector<v1::JobEvent>& straight,
                                        const std::vector<v1::JobEvent>& resumed) {
  std::map<int64_t, v1::StepMetrics> steps;
  std::vector<std::pair<int64_t, double>> evals;
  for (const v1::JobEvent& e : straight) {
    if (e.has_step()) steps[e.step().step()] = e.step();
    if (e.has_eval()) evals.emplace_back(e.eval().step(), static_cast<float>(e.eval().loss()));
  }
  ASSERT_EQ(steps.size(), 16u);
  const nlohmann::json killed_tb = ReadTensorBoard(jobs_dir + killed_id + "/tensorboard");
  const nlohmann::json straight_tb = ReadTensorBoard(jobs_dir + straight_id + "/tensorboard");
  using Get = std::function<double(const v1::StepMetrics&)>;
  auto series = [&](const Get& get) {
    std::vector<std::pair<int64_t, double>> s;
    for (const auto& [step, m] : steps) s.emplace_back(step, static_cast<float>(get(m)));
    return s;
  };
  const std::vector<std::pair<std::string, Get>> exact = {
      {"train/loss", [](const v1::StepMetrics& m) { return m.loss(); }},
      {"train/learning_rate", [](const v1::StepMetrics& m) { return m.learning_rate(); }},
      {"train/grad_norm", [](const v1::StepMetrics& m) { return m.grad_norm(); }}};
  for (const auto& [tag, get] : exact) {
    EXPECT_EQ(TensorBoardSeries(killed_tb, tag), series(get)) << tag;
    EXPECT_EQ(TensorBoardSeries(straight_tb, tag), series(get)) << tag;
  }
  EXPECT_EQ(TensorBoardSeries(straight_tb, "train/tokens_per_second"),
            series([](const v1::StepMetrics& m) { return m.tokens_per_second(); }));
  EXPECT_EQ(TensorBoardSeries(straight_tb, "train/bubble_ratio"),
            series([](const v1::StepMetrics& m) { return m.bubble_ratio(); }));
  const auto killed_tps_series = TensorBoardSeries(killed_tb, "train/tokens_per_second");
  std::map<int64_t, double> killed_tps(killed_tps_series.begin(), killed_tps_series.end());
  int after_restart = 0;
  for (const v1::JobEvent& e : resumed) {
    if (!e.has_step()) continue;
    ++after_restart;
    EXPECT_EQ(killed_tps[e.step().step()], static_cast<float>(e.step().tokens_per_second())) << e.step().step();
  }
  EXPECT_GE(after_restart, 6);
  EXPECT_EQ(TensorBoardSeries(killed_tb, "eval/loss"), evals);
  EXPECT_EQ(TensorBoardSeries(straight_tb, "eval/loss"), evals);
  // The spec as hyperparameters, once per job.
  EXPECT_EQ(killed_tb["plugins"]["hparams"].size(), 1u);
  EXPECT_EQ(killed_tb["hparams"]["max_steps"], 16.0);
  EXPECT_EQ(killed_tb["hparams"]["optimizer.mode"], "OPTIMIZER_MODE_ASYNC");
}

// Exact resume (issue: checkpoints): a job killed with SIGKILL at an arbitrary step, its newest
// checkpoint damaged on top, continues after a restart from the previous good checkpoint and ends
// with weights bit-identical to the same job run straight through — async optimizer included —
// so no batch of its token file was skipped or repeated.
TEST_F(DaemonTest, SigkilledJobResumesFromItsCheckpointBitIdentically) {
  ASSERT_TRUE(StartDaemon());
  v1::JobSpec spec = TinySpec();
  spec.mutable_optimizer()->set_mode(v1::OPTIMIZER_MODE_ASYNC);
  spec.mutable_optimizer()->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::KIND_WARMUP_COSINE);
  spec.mutable_optimizer()->mutable_lr_schedule()->set_warmup_steps(3);
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(30000));
  // Shuffled windows: the order must survive the kill too (it is a function of the cursor).
  spec.mutable_data()->mutable_token_file()->set_shuffle(true);
  spec.mutable_data()->mutable_token_file()->set_shuffle_seed(5);
  spec.mutable_checkpoint()->set_every_steps(2);
  spec.set_max_steps(16);
  // Evaluations every 3 steps (drain points of the async job) with the best checkpoint kept:
  // their state is in the checkpoints, so the resumed job evaluates and ends like the straight one.
  const std::string valid = ValidationFile(3000);
  spec.mutable_data()->mutable_validation()->set_path(valid);
  spec.mutable_eval()->set_every_steps(3);
  spec.mutable_eval()->set_keep_best_checkpoint(true);
  std::string killed_id;
  // Killed once step 9 is reported (the job may be further): every checkpoint after step 6 is
  // damaged below, so it resumes from step 6, an evaluation step whose checkpoint was written
  // before its evaluation: that evaluation runs again after the restart (and must show once in
  // TensorBoard).
  const int kill_after = 9;
  {
    auto c = daemon_.Connect();
    auto job = c->Submit(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    killed_id = job->id();
    Watcher w(*c, killed_id);
    ASSERT_TRUE(w.WaitForSteps(kill_after));
    daemon_.Stop(9);  // no drain, no goodbye
  }
  // Damage every checkpoint after step 6: the restart must notice (checksum) and take step 6's.
  const std::string ckpts = root_ + "/state/jobs/" + killed_id + "/checkpoints";
  std::vector<std::string> steps;
  for (const auto& e : std::filesystem::directory_iterator(ckpts)) {
    if (e.path().filename().string().rfind("step-", 0) == 0) steps.push_back(e.path().string());
  }
  ASSERT_GE(steps.size(), 2u);
  std::sort(steps.begin(), steps.end(), [](const std::string& a, const std::string& b) {
    return std::stoi(a.substr(a.rfind('-') + 1)) < std::stoi(b.substr(b.rfind('-') + 1));
  });
  int damaged = 0;
  for (const std::string& dir : steps) {
    if (std::stoi(dir.substr(dir.rfind('-') + 1)) <= 6) continue;
    ++damaged;
    std::fstream f(dir + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  ASSERT_GE(damaged, 1) << "no checkpoint after step 6 to damage";
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto c = daemon_.Connect();
  Watcher w(*c, killed_id);
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  auto resumed = c->Get(killed_id);
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->progress().step(), 16);
  EXPECT_NE(daemon_.Output().find("fails its checksum"), std::string::npos)
      << "the damaged checkpoint was not reported";
  EXPECT_NE(daemon_.Output().find("checkpoints/step-6 (step 6,"), std::string::npos) << daemon_.Output();
  // The same job straight through, in the restarted daemon.
  auto straight = c->Submit(spec);
  ASSERT_TRUE(straight.ok());
  Watcher ws(*c, straight->id());
  ASSERT_TRUE(ws.WaitForState(v1::JOB_STATE_SUCCEEDED));
  auto a = c->Export(killed_id, root_ + "/data/resumed");
  auto b = c->Export(straight->id(), root_ + "/data/straight");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  auto ta = ReadSafetensors(*a + "/model.safetensors"), tb = ReadSafetensors(*b + "/model.safetensors");
  ASSERT_EQ(ta.size(), tb.size());
  ASSERT_FALSE(ta.empty());
  for (const auto& [name, t] : ta) EXPECT_TRUE(at::equal(t, tb[name])) << name;
  // The evaluations after the restart are the straight run's, bit for bit, and so is the record.
  std::map<int64_t, double> straight_evals;
  for (const v1::JobEvent& e : ws.Events()) {
    if (e.has_eval()) straight_evals[e.eval().step()] = e.eval().loss();
  }
  EXPECT_EQ(straight_evals.size(), 6u);  // steps 3, 6, 9, 12, 15 and the end (16)
  int resumed_evals = 0;
  for (const v1::JobEvent& e : w.Events()) {
    if (!e.has_eval()) continue;
    ++resumed_evals;
    EXPECT_EQ(e.eval().loss(), straight_evals[e.eval().step()]) << "eval at step " << e.eval().step();
  }
  EXPECT_GE(resumed_evals, 3);
  ExpectTensorBoardMatchesTheMetrics(root_ + "/state/jobs/", killed_id, straight->id(), ws.Events(), w.Events());
  auto done = c->Get(straight->id());
  resumed = c->Get(killed_id);
  ASSERT_TRUE(done.ok() && resumed.ok());
  EXPECT_EQ(resumed->last_eval().loss(), done->last_eval().loss());
  EXPECT_EQ(resumed->last_eval().best_loss(), done->last_eval().best_loss());
  EXPECT_EQ(resumed->last_eval().best_step(), done->last_eval().best_step());
  EXPECT_FALSE(done->best_checkpoint().empty());
  EXPECT_TRUE(std::filesystem::exists(resumed->best_checkpoint() + "/meta.json")) << resumed->best_checkpoint();
  // An explicit checkpoint of the finished job holds all 16 steps.
  auto ck = c->Checkpoint(straight->id());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->step(), 16);
}

}  // namespace
}  // namespace rp::testing
