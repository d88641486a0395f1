#include "server/recovery_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/job_events.h"
#include "server/job_table.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

bool PausedByDrain(const v1::Job& record) {
  if (record.state() != v1::JOB_STATE_PAUSED) return false;
  // The legacy form: the only way records before field 18 said it.
  return record.paused_by_drain() || record.message() == "paused by a daemon drain";
}

RecoveryPlan PlanRecovery(const v1::Job& record) {
  const v1::JobState s = record.state();
  if (IsTerminal(s)) return {RecoveryAction::kList, false};
  const bool user_paused = s == v1::JOB_STATE_PAUSED && !PausedByDrain(record);
  return {record.has_started() ? RecoveryAction::kResume : RecoveryAction::kReadmit, user_paused};
}

CheckpointResume ResumeAt(int64_t checkpoint_step, int64_t max_steps) {
  if (max_steps <= 0) return {false, 0};
  if (checkpoint_step >= max_steps) return {true, 0};
  return {false, max_steps - checkpoint_step};
}

WithoutCheckpoint PlanWithoutCheckpoint(int64_t steps_done) {
  if (steps_done <= 0) return {true, ""};  // stopped while starting (tokenizing, loading)
  return {false, absl::StrCat("interrupted by a daemon restart at step ", steps_done,
                              " with no usable checkpoint; submit it again")};
}

int64_t HighestJobSeq(const std::vector<std::string>& names) {
  int64_t highest = 0;
  for (const std::string& n : names) highest = std::max(highest, JobTable::SeqOf(n));
  return highest;
}

}  // namespace rp::server
