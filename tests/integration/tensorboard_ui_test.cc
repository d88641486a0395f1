// TensorBoard as a person opens it (issue: what a fine-tuner looks at): a job trained by the real
// daemon, PyPI tensorboard's server on loopback over the job's files, and Debian's headless
// Chromium loading its time-series page: the job's scalar tags are in the rendered page; the
// server's hparams API serves the job's spec. A screenshot is kept for a person to look at
// (<build>/test-artifacts/tensorboard_scalars.png).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <thread>

#include "tests/integration/fixtures.h"
#include "tests/support/run_command.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;
using namespace std::chrono_literals;

// `tensorboard --logdir DIR --port 0` in the background; its address once it listens.
class TensorBoardServer {
 public:
  explicit TensorBoardServer(const std::string& logdir, const std::string& log_file) : log_(log_file) {
    std::string out;
    RunCommand(std::string("cd / && $(dirname ") + RP_VENV_PYTHON + ")/tensorboard --logdir '" + logdir +
                   "' --host 127.0.0.1 --port 0 --load_fast=false >'" + log_ + "' 2>&1 & echo $!",
               &out);
    pid_ = std::atoi(out.c_str());
  }
  ~TensorBoardServer() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }
  // "http://127.0.0.1:PORT/", or empty after `timeout`.
  std::string WaitForAddress(std::chrono::seconds timeout) {
    const std::regex at("TensorBoard [^ ]+ at (http://127\\.0\\.0\\.1:[0-9]+/)");
    for (auto end = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < end;) {
      std::smatch m;
      const std::string text = ReadWholeFile(log_);
      if (std::regex_search(text, m, at)) return m[1];
      std::this_thread::sleep_for(200ms);
    }
    return "";
  }
  std::string Log() const { return ReadWholeFile(log_); }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

// Headless Chromium: the page's DOM after it ran for `budget_ms` of virtual time, or a screenshot.
std::string Chromium(const std::string& args, const std::string& url, std::string* output) {
  const std::string cmd =
      "timeout 120 chromium --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage "
      "--user-data-dir=$(mktemp -d) --virtual-time-budget=20000 " +
      args + " '" + url + "'";
  const int rc = RunCommand(cmd, output);
  return rc == 0 ? "" : "chromium failed (rc " + std::to_string(rc) + "; is Debian's chromium installed?)";
}

TEST_F(DaemonTest, TensorBoardShowsAJobsCurvesInABrowserAndServesItsHyperparameters) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  spec.set_max_steps(6);
  spec.mutable_optimizer()->set_lr(3e-4);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  const std::string logdir = root_ + "/state/jobs/" + job->id() + "/tensorboard";
  ASSERT_TRUE(std::filesystem::is_directory(logdir));

  TensorBoardServer tb(logdir, root_ + "/tensorboard.log");
  const std::string url = tb.WaitForAddress(60s);
  ASSERT_FALSE(url.empty()) << "tensorboard did not start:\n" << tb.Log();
  // The time-series page lists every scalar tag as a card (a tall window: cards below the fold
  // are not rendered).
  std::string dom;
  ASSERT_EQ(Chromium("--window-size=1400,6000 --dump-dom", url + "#timeseries", &dom), "") << dom;
  for (const char* tag : {"train/loss", "train/learning_rate", "train/grad_norm", "train/tokens_per_second",
                          "train/bubble_ratio", "train/step_seconds"}) {
    EXPECT_NE(dom.find(tag), std::string::npos) << tag << " is not on the scalars page";
  }
  // The hyperparameters as the HPARAMS tab gets them (its dashboard renders in a frame that a DOM
  // dump does not reach): the server's own experiment API.
  std::string hparams;
  const std::string post = std::string(RP_VENV_PYTHON) +
                           " -c \"import sys, urllib.request as u; r = u.Request(sys.argv[1], data=b'{}', "
                           "headers={'Content-Type': 'application/json', 'X-XSRF-Protected': '1'}); "
                           "print(u.urlopen(r, timeout=30).read().decode())\" '" +
                           url + "data/plugin/hparams/experiment'";
  ASSERT_EQ(RunCommand(post, &hparams), 0) << hparams;
  EXPECT_NE(hparams.find("\"optimizer.lr\""), std::string::npos) << hparams;
  EXPECT_NE(hparams.find("\"max_steps\""), std::string::npos) << hparams;
  EXPECT_NE(hparams.find("\"train/loss\""), std::string::npos) << "metrics: " << hparams;
  // And a picture, for a person.
  const std::string shot = std::string(RP_ARTIFACT_DIR) + "/tensorboard_scalars.png";
  std::filesystem::create_directories(RP_ARTIFACT_DIR);
  std::filesystem::remove(shot);
  std::string out;
  ASSERT_EQ(Chromium("--window-size=1400,1000 --screenshot=" + shot, url + "#timeseries", &out), "") << out;
  EXPECT_GT(std::filesystem::file_size(shot), 10000u) << out;
  std::printf("TensorBoard screenshot: %s\n", shot.c_str());
}

}  // namespace
}  // namespace rp::testing
