// What `roundpipe watch` prints (client/watch_view.h): plain lines when the output is not a
// terminal (no escape codes; the curve once at the end), and in a terminal a live block — the curve above the
// progress line — redrawn in place, with events printed above it. (As a person sees it in a real
// terminal: the daemon test that runs it under tmux.)
#include "client/watch_view.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace rp::client {
namespace {

namespace v1 = roundpipe::v1;

v1::JobEvent Step(int64_t step, double loss) {
  v1::JobEvent e;
  e.mutable_step()->set_step(step);
  e.mutable_step()->set_loss(loss);
  e.mutable_step()->set_bubble_ratio(0.501);
  return e;
}

v1::JobEvent State(v1::JobState s) {
  v1::JobEvent e;
  e.set_state(s);
  return e;
}

std::string Watch(const WatchViewOptions& o, int steps) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buf, &size);
  {
    WatchView view("job-000001", out, o);
    for (int k = 1; k <= steps; ++k) view.OnEvent(Step(k, 5.0 - 0.1 * k));
    v1::JobEvent eval;
    eval.mutable_eval()->set_step(steps);
    eval.mutable_eval()->set_loss(4.0);
    view.OnEvent(eval);
    view.OnEvent(State(v1::JOB_STATE_SUCCEEDED));
    view.Finish();
    EXPECT_EQ(view.final_state(), v1::JOB_STATE_SUCCEEDED);
  }
  std::fclose(out);
  std::string s(buf, size);
  std::free(buf);
  return s;
}

TEST(WatchView, APipeGetsPlainLines) {
  WatchViewOptions o;
  o.total_steps = 20;
  o.cpu_workers = true;
  const std::string s = Watch(o, 20);
  EXPECT_EQ(s.find('\x1b'), std::string::npos) << s;
  // The curve once, at the end, after the last line of the job.
  const size_t curve = s.find("\xE2\xA0");
  ASSERT_NE(curve, std::string::npos) << "the curve at the end";
  EXPECT_GT(curve, s.find("[job-000001] SUCCEEDED")) << s;
  EXPECT_EQ(s.find("train loss"), s.rfind("train loss")) << "once";
  EXPECT_NE(s.find("[job-000001] step 1/20"), std::string::npos) << s;
  EXPECT_NE(s.find("[job-000001] step 10/20"), std::string::npos) << s;
  EXPECT_NE(s.find("[job-000001] step 20/20"), std::string::npos) << s;
  EXPECT_EQ(s.find("step 7/20"), std::string::npos) << "every tenth step only";
  EXPECT_NE(s.find("bubble 50.1%"), std::string::npos);
  EXPECT_NE(s.find("bubble = the share of the workers' compute time"), std::string::npos) << s;
  EXPECT_NE(s.find("[job-000001] SUCCEEDED"), std::string::npos) << s;
}

TEST(WatchView, ATerminalGetsTheCurveRedrawnInPlaceWithEventsAbove) {
  WatchViewOptions o;
  o.terminal = true;
  o.columns = 100;
  o.total_steps = 12;
  const std::string s = Watch(o, 12);
  EXPECT_NE(s.find("\xE2\xA0"), std::string::npos) << "a braille curve";
  EXPECT_NE(s.find("train loss"), std::string::npos);
  EXPECT_NE(s.find("\x1b[J"), std::string::npos) << "the block is cleared and redrawn";
  // After the last redraw: the state line printed above, then the block: curve, then progress.
  const size_t state = s.rfind("[job-000001] SUCCEEDED");
  const size_t last_curve = s.rfind("train loss");
  const size_t last_progress = s.rfind("step 12/12");
  ASSERT_NE(state, std::string::npos);
  EXPECT_LT(state, last_curve);
  EXPECT_LT(last_curve, last_progress);
  EXPECT_NE(s.rfind("\xE2\x97\x86"), std::string::npos) << "the evaluation's diamond";
  EXPECT_EQ(s.find("bubble = "), std::string::npos) << "GPU workers: no CPU note";
}

}  // namespace
}  // namespace rp::client
