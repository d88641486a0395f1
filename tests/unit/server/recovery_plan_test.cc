// What a restarted daemon does with each stored job, decided from the record alone: ended jobs
// are listed, never-run ones admitted again, started ones resumed; a user's pause survives the
// restart, a drain's does not (from the typed field, and from the message of records written
// before it existed); how many steps a resumed job has left; ids continue after job dirs.
#include "server/recovery_plan.h"

#include <gtest/gtest.h>

namespace rp::server {
namespace {

namespace v1 = roundpipe::v1;

v1::Job Record(v1::JobState state, bool started, bool paused_by_drain = false, std::string message = "") {
  v1::Job r;
  r.set_id("job-000007");
  r.set_state(state);
  if (started) r.mutable_started()->set_seconds(1700000000);
  r.set_paused_by_drain(paused_by_drain);
  r.set_message(std::move(message));
  return r;
}

TEST(PlanRecovery, EndedJobsAreListedNeverRunOnesReadmittedStartedOnesResumed) {
  for (v1::JobState s : {v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    EXPECT_EQ(PlanRecovery(Record(s, true)).action, RecoveryAction::kList) << v1::JobState_Name(s);
    EXPECT_EQ(PlanRecovery(Record(s, false)).action, RecoveryAction::kList) << v1::JobState_Name(s);
  }
  const RecoveryPlan queued = PlanRecovery(Record(v1::JOB_STATE_QUEUED, false));
  EXPECT_EQ(queued.action, RecoveryAction::kReadmit);
  EXPECT_FALSE(queued.pause_again);
  const RecoveryPlan running = PlanRecovery(Record(v1::JOB_STATE_RUNNING, true));
  EXPECT_EQ(running.action, RecoveryAction::kResume);
  EXPECT_FALSE(running.pause_again);
  // RUNNING but never started cannot be written by the tracker; a damaged record still recovers.
  EXPECT_EQ(PlanRecovery(Record(v1::JOB_STATE_RUNNING, false)).action, RecoveryAction::kReadmit);
}

TEST(PlanRecovery, AUsersPauseSurvivesTheRestartADrainsDoesNot) {
  const RecoveryPlan user = PlanRecovery(Record(v1::JOB_STATE_PAUSED, true, false, "paused"));
  EXPECT_EQ(user.action, RecoveryAction::kResume);
  EXPECT_TRUE(user.pause_again);
  const RecoveryPlan user_queued = PlanRecovery(Record(v1::JOB_STATE_PAUSED, false, false, "paused"));
  EXPECT_EQ(user_queued.action, RecoveryAction::kReadmit);
  EXPECT_TRUE(user_queued.pause_again);
  // The typed field decides, whatever the message says.
  const RecoveryPlan drained = PlanRecovery(Record(v1::JOB_STATE_PAUSED, true, true, "anything at all"));
  EXPECT_EQ(drained.action, RecoveryAction::kResume);
  EXPECT_FALSE(drained.pause_again);
  EXPECT_FALSE(PlanRecovery(Record(v1::JOB_STATE_PAUSED, false, true)).pause_again);
  // A record from before the field: its message was the only mark of a drain.
  EXPECT_TRUE(PausedByDrain(Record(v1::JOB_STATE_PAUSED, true, false, "paused by a daemon drain")));
  EXPECT_FALSE(PlanRecovery(Record(v1::JOB_STATE_PAUSED, true, false, "paused by a daemon drain")).pause_again);
  // Only a paused job can have been paused by a drain.
  EXPECT_FALSE(PausedByDrain(Record(v1::JOB_STATE_RUNNING, true, true)));
}

TEST(ResumeAt, StepsLeftAfterACheckpointAndAJobThatHadAlreadyFinished) {
  const CheckpointResume mid = ResumeAt(4, 10);
  EXPECT_FALSE(mid.already_finished);
  EXPECT_EQ(mid.steps_left, 6);
  EXPECT_TRUE(ResumeAt(10, 10).already_finished);
  EXPECT_TRUE(ResumeAt(12, 10).already_finished);
  const CheckpointResume open = ResumeAt(4, 0);  // until the data ends
  EXPECT_FALSE(open.already_finished);
  EXPECT_EQ(open.steps_left, 0);
  const CheckpointResume first = ResumeAt(0, 10);
  EXPECT_FALSE(first.already_finished);
  EXPECT_EQ(first.steps_left, 10);
}

TEST(PlanWithoutCheckpoint, AJobWithoutStepsStartsOverOneWithStepsIsListedPaused) {
  EXPECT_TRUE(PlanWithoutCheckpoint(0).start_over);
  const WithoutCheckpoint stepped = PlanWithoutCheckpoint(7);
  EXPECT_FALSE(stepped.start_over);
  EXPECT_NE(stepped.message.find("at step 7 with no usable checkpoint"), std::string::npos) << stepped.message;
}

TEST(HighestJobSeq, OnlyJobDirectoriesCount) {
  EXPECT_EQ(HighestJobSeq({}), 0);
  EXPECT_EQ(HighestJobSeq({"export-journal", "job-000003", "job-000012", "job-00009", "jobs.db", "job-x"}), 12);
  EXPECT_EQ(HighestJobSeq({"job-", "job--4", "notes"}), 0);
}

}  // namespace
}  // namespace rp::server
