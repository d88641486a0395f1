// `roundpipe watch` as a person sees it (issue: what a fine-tuner looks at): the CLI submits a job
// with --watch inside a real terminal (tmux), and the captured pane shows the loss curve (braille
// dots, evaluation diamonds, the legend) above the final progress line. The capture is kept for a
// person to look at (<build>/test-artifacts/watch_tmux.txt).
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_split.h"
#include "tests/integration/fixtures.h"
#include "tests/support/run_command.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;
using namespace std::chrono_literals;

// The number of braille characters (U+2800..U+28FF, UTF-8 E2 A0..A3 xx) in `s`.
int BrailleCount(const std::string& s) {
  int n = 0;
  for (size_t i = 0; i + 2 < s.size(); ++i) {
    if (static_cast<unsigned char>(s[i]) == 0xE2 && (static_cast<unsigned char>(s[i + 1]) & 0xFC) == 0xA0) ++n;
  }
  return n;
}

TEST_F(DaemonTest, WatchInATerminalDrawsTheLossCurveAboveTheProgressLine) {
  ASSERT_TRUE(StartDaemon());
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(30000));
  spec.set_max_steps(40);
  const std::string valid = ValidationFile(3000);
  spec.mutable_data()->mutable_validation()->set_path(valid);
  spec.mutable_eval()->set_every_steps(10);
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json).ok());
  const std::string spec_file = root_ + "/spec.json";
  std::ofstream(spec_file) << json;

  const std::string tmux = "LANG=C.UTF-8 tmux -u -S '" + root_ + "/tmux.sock' ";
  const std::string inner = std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address() + " submit " + spec_file +
                            " --watch; echo WATCH-EXIT=$?; sleep 600";
  std::string out;
  ASSERT_EQ(RunCommand(tmux + "new-session -d -x 110 -y 45 -s watch \"" + inner + "\"", &out), 0) << out;
  std::string pane;
  for (auto end = std::chrono::steady_clock::now() + 180s; std::chrono::steady_clock::now() < end;) {
    RunCommand(tmux + "capture-pane -p -t watch", &pane);
    if (pane.find("WATCH-EXIT=") != std::string::npos) break;
    std::this_thread::sleep_for(250ms);
  }
  RunCommand(tmux + "kill-server", &out);
  std::filesystem::create_directories(RP_ARTIFACT_DIR);
  std::ofstream(std::string(RP_ARTIFACT_DIR) + "/watch_tmux.txt") << pane;
  std::printf("the pane as captured: %s/watch_tmux.txt\n%s\n", RP_ARTIFACT_DIR, pane.c_str());

  ASSERT_NE(pane.find("WATCH-EXIT=0"), std::string::npos) << pane;
  EXPECT_NE(pane.find("SUCCEEDED"), std::string::npos);
  EXPECT_NE(pane.find("train loss"), std::string::npos) << "the legend";
  EXPECT_GE(BrailleCount(pane), 30) << "the curve";
  EXPECT_NE(pane.find("\xE2\x97\x86"), std::string::npos) << "an evaluation's diamond";
  // The block ends the output: the curve's step labels, then the progress line of the last step.
  std::vector<std::string> lines = absl::StrSplit(pane, '\n');
  while (!lines.empty() && lines.back().find_first_not_of(' ') == std::string::npos) lines.pop_back();
  ASSERT_GE(lines.size(), 3u);
  EXPECT_NE(lines[lines.size() - 1].find("WATCH-EXIT=0"), std::string::npos);
  EXPECT_NE(lines[lines.size() - 2].find("step 40/40"), std::string::npos) << lines[lines.size() - 2];
  EXPECT_NE(lines[lines.size() - 3].find("step 1"), std::string::npos) << "the x axis' labels above it";
  EXPECT_NE(lines[lines.size() - 3].find("40"), std::string::npos);
}

}  // namespace
}  // namespace rp::testing
