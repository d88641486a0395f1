// Every long step of a job honours cancel, pause and drain, and says what it is doing: here the
// evaluation pass over a large validation set, through the real roundpiped process. A pause (or a
// drain) abandons the pass within seconds and the pass runs again at the same step after the
// resume or the restart; a cancel during the final evaluation ends the job CANCELLED.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/integration/daemon_process.h"
#include "tests/integration/fixtures.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;
using namespace std::chrono_literals;

class LongStepsTest : public DaemonTest {
 protected:
  // A token-file job evaluated on a validation file of `validation_tokens` (tens of seconds of
  // evaluation on 2 cores for 8M tokens) at every `every` steps (0: only the final one).
  v1::JobSpec EvaluatedSpec(int64_t validation_tokens, int every, int max_steps) {
    v1::JobSpec spec = TinySpec();
    spec.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
    spec.mutable_data()->mutable_validation()->set_path(TokenFile(static_cast<int>(validation_tokens)));
    spec.mutable_batching()->set_global_batch(64);
    spec.mutable_batching()->set_micro_batch(32);
    spec.mutable_batching()->set_sequence_length(64);
    if (every > 0) spec.mutable_eval()->set_every_steps(every);
    spec.set_max_steps(max_steps);
    spec.set_output_dir(root_ + "/data/out-" + std::to_string(max_steps));
    return spec;
  }
  static auto Evaluating(int64_t step) {
    const std::string needle = "evaluating at step " + std::to_string(step) + ":";
    return [needle](const v1::Job& j) { return j.message().find(needle) != std::string::npos; };
  }
};

TEST_F(LongStepsTest, AnEvaluationHonoursPauseDrainAndCancel) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  auto job = c->Submit(EvaluatedSpec(8 << 20, 2, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  // The pass reports its progress, then a pause ends it (no eval reported) within seconds.
  ASSERT_TRUE(WaitForRecord(*c, job->id(), Evaluating(2), 120s)) << c->Get(job->id())->message();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(c->Pause(job->id()).ok());
  ASSERT_TRUE(WaitForRecord(
      *c, job->id(), [](const v1::Job& j) { return j.state() == v1::JOB_STATE_PAUSED; }, 60s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  auto rec = c->Get(job->id());
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->progress().step(), 2);
  EXPECT_FALSE(rec->has_last_eval()) << "an abandoned pass reports no loss";
  // Resumed: the pass runs again at step 2; SIGTERM drains it within seconds, checkpointed at 2.
  ASSERT_TRUE(c->Resume(job->id()).ok());
  ASSERT_TRUE(WaitForRecord(*c, job->id(), Evaluating(2), 120s)) << c->Get(job->id())->message();
  EXPECT_LT(SecondsToStop(daemon_, SIGTERM, 120s), 20.0) << daemon_.Output();
  // Restarted from that checkpoint: the pass runs at step 2 once more; a cancel ends the job.
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto again = daemon_.Connect();
  ASSERT_TRUE(WaitForRecord(*again, job->id(), Evaluating(2), 120s)) << again->Get(job->id())->message();
  t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(again->Cancel(job->id()).ok());
  ASSERT_TRUE(WaitForRecord(
      *again, job->id(), [](const v1::Job& j) { return j.state() == v1::JOB_STATE_CANCELLED; }, 60s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(again->Get(job->id())->progress().step(), 2);
}

TEST_F(LongStepsTest, ACancelDuringTheFinalEvaluationEndsTheJobCancelled) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  auto job = c->Submit(EvaluatedSpec(8 << 20, 0, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitForRecord(*c, job->id(), Evaluating(1), 120s)) << c->Get(job->id())->message();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  ASSERT_TRUE(WaitForRecord(
      *c, job->id(), [](const v1::Job& j) { return j.state() == v1::JOB_STATE_CANCELLED; }, 60s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  auto rec = c->Get(job->id());
  ASSERT_TRUE(rec.ok());
  EXPECT_NE(rec->message().find("cancelled during the final evaluation"), std::string::npos) << rec->message();
  EXPECT_FALSE(rec->has_last_eval());
  EXPECT_EQ(daemon_.Stop(), 0) << daemon_.Output();
}

}  // namespace
}  // namespace rp::testing
