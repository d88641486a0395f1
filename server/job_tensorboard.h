// job_tensorboard.h — a job's TensorBoard log as the daemon keeps it: what each engine event adds
// (a step's scalars are the values WatchJob's StepMetrics carry, an evaluation's its EvalMetrics)
// and the job spec's set fields as hyperparameters, written to <output_dir>/tensorboard through
// rp::tensorboard::EventLog.
//
// Contract: one JobTensorBoard per running job, owned and used by the job's event pump thread
// only (no lock). It never fails a job: a log that cannot be opened or written is reported once
// in the daemon's log and the job's logging stops; the job trains on.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "roundpipe/v1/jobs.pb.h"
#include "scheduler/engine_types.h"
#include "server/tensorboard/event_log.h"

namespace rp::server {

// A sample generation as TensorBoard's text tab shows it (tag "samples/<i>" at the eval's step).
std::string SampleMarkdown(const roundpipe::v1::Sample& s);
// The scalars one step logs, tagged "train/...".
tensorboard::EventLog::Scalars StepScalars(const scheduler::IterationStats& st, const roundpipe::v1::StepMetrics& m);
// Every set scalar field of `spec` (nested messages flattened to dotted names, enums by name,
// repeated scalars joined with commas; repeated messages and byte strings left out), for the
// HPARAMS tab.
std::vector<std::pair<std::string, tensorboard::EventLog::HParam>> SpecHParams(const google::protobuf::Message& spec);

class JobTensorBoard {
 public:
  // `record`: the job as its pump starts (its spec; progress().step() is where it resumes: the
  // files' records of later steps are dropped). Disabled in the spec: does nothing. Touches no
  // file yet: the log is opened at the first step or evaluation (a queued job writes nothing).
  // `evaluated_at_resume`: the state it resumes from holds the evaluation of its step (else an
  // evaluation due at that step runs again, and its records there are dropped too).
  JobTensorBoard(const std::string& job_id, const roundpipe::v1::Job& record, const std::string& output_dir,
                 bool evaluated_at_resume = false);
  // After the tracker applied `e` (`out` is what watchers were sent for it).
  void OnEvent(const scheduler::JobEvent& e, const roundpipe::v1::JobEvent& out);
  bool active() const { return log_ != nullptr; }

 private:
  void Open();
  void Check(const absl::Status& st);

  std::string job_id_;
  std::string dir_;
  int64_t resume_step_ = 0;
  bool evaluated_at_resume_ = false;
  bool enabled_ = true;  // not disabled by the spec, and not yet tried
  roundpipe::v1::JobSpec spec_;
  std::unique_ptr<tensorboard::EventLog> log_;
};

}  // namespace rp::server
