// recovery_plan.h — what a restarted daemon does with each job its store lists, decided from the
// stored record alone (and, for a job that had started, from the step of each checkpoint it
// finds). Pure: no engine, no files; JobManager's restart recovery (job_recovery.cc) carries
// the decisions out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "roundpipe/v1/jobs.pb.h"

namespace rp::server {

enum class RecoveryAction {
  kList,     // it had ended: listed as it was
  kReadmit,  // it never ran: admitted again from its stored spec
  kResume,   // it had started: resumes from its newest usable checkpoint
};

struct RecoveryPlan {
  RecoveryAction action = RecoveryAction::kList;
  // Its user paused it (a drain's pause does not count): it is admitted paused and runs only
  // after Resume.
  bool pause_again = false;
};

RecoveryPlan PlanRecovery(const roundpipe::v1::Job& record);

// Paused by a daemon drain rather than by its user. Records written before the job record had
// `paused_by_drain` said so only in their message; those are recognised too, so a daemon
// upgraded through a drain resumes its jobs.
bool PausedByDrain(const roundpipe::v1::Job& record);

// Resuming a job of `max_steps` steps (0: until its data ends) from a checkpoint after
// `checkpoint_step` steps.
struct CheckpointResume {
  bool already_finished = false;  // the checkpoint holds the last step: only the final record was lost
  int64_t steps_left = 0;         // max_steps of the resumed run (0: until the data ends)
};
CheckpointResume ResumeAt(int64_t checkpoint_step, int64_t max_steps);

// A started job that no checkpoint resumes: one that never finished a step starts over (nothing
// is lost); else it is listed PAUSED with `message`.
struct WithoutCheckpoint {
  bool start_over = false;
  std::string message;
};
WithoutCheckpoint PlanWithoutCheckpoint(int64_t steps_done);

// The highest seq among job directory names ("job-000042"), 0 when none is one: new ids continue
// after it even if the store was damaged or replaced.
int64_t HighestJobSeq(const std::vector<std::string>& names);

}  // namespace rp::server
