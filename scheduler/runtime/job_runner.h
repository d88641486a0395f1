// job_runner.h — (runtime) runs one built job on the engine's devices: takes batches (from the
// job's queue or its token file), submits iterations (async: one in flight across the boundary),
// reports each step, applies the failure policies (divergence, fp16 overflow, checkpoints that
// keep failing), serves checkpoint requests and the checkpoint_every policy at iteration
// boundaries, pauses and resumes, and ends the job with its final checkpoint written.
//
// Contract: the engine's runner thread only, with the job built (store and controller set).
// Every state change is an event of the job (EngineJob::SetState).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/runtime/engine_job.h"

namespace rp::scheduler::runtime {

class JobRunner {
 public:
  explicit JobRunner(EngineJob& job);
  // Until the job ends (succeeded, failed, cancelled).
  void Run();

 private:
  // A generation job (EngineJob::generation_only): the samples from the loaded weights, kept in
  // job.generated; the job ends SUCCEEDED, CANCELLED (a cancel seen between tokens) or FAILED.
  void RunGeneration();
  // Awaits the pending iteration and reports it; false when the job must stop (it failed).
  bool FinishPending();
  // Reports the pending iteration, runs the final evaluation, flushes the optimizer, writes a
  // daemon job's final checkpoint (export works after any restart, and the store can be
  // released), then `s`. False when a pause interrupted the final evaluation: the job did not end
  // (the loop pauses, and ends it again after the resume); a cancel there ends it CANCELLED.
  bool End(JobState s, std::string message);
  // Checkpoint requests (served between iterations): report the pending iteration, flush the
  // optimizer (async), write. False when the job failed meanwhile.
  bool TakeCheckpoints();
  // The checkpoint_every policy: when the steps submitted so far reach a multiple of it, the
  // checkpoint is taken before more are submitted (exactly that many steps, whatever the timing).
  void PolicyCheckpoint();
  // Pause point (between iterations): report the pending iteration, flush the optimizer so the
  // store is consistent, then wait for Resume or Cancel (serving checkpoint requests meanwhile).
  bool MaybePause();
  bool Cancelled();
  // The evaluation policy: when the steps submitted so far reach a multiple of eval.every_steps,
  // the evaluation runs before more are submitted (on exactly that many steps, whatever the
  // timing). kEnded when the job ended (it failed, or stopped early).
  enum class EvalOutcome { kDone, kInterrupted, kEnded };
  EvalOutcome MaybeEvaluate();
  // One pass over the validation source at the current step (the pending iteration reported, the
  // optimizer flushed): reports it (kEval), keeps the best checkpoint, and unless `at_end` stops
  // the job when early stopping says so. A cancel or pause (a drain is one) seen between
  // validation batches abandons the pass with nothing reported (kInterrupted: it runs again at
  // this step after the resume, or after a restart from this step's checkpoint). A pass that
  // runs long reports its progress (kProgress, "evaluating at step S: batch b of B").
  EvalOutcome Evaluate(bool at_end);
  // Evaluate's pass over the validation source at `step`, then the sample generations
  // (EvalPolicy::samples), with run_mu held: kDone with *pass filled, kInterrupted (a cancel or
  // pause seen), or kEnded (it failed the job).
  struct EvalPass {
    double sum = 0;
    int64_t tokens = 0;
    std::vector<GeneratedSample> samples;
  };
  EvalOutcome RunEvalPass(int64_t step, std::chrono::steady_clock::time_point t0, EvalPass* pass);
  // Writes the measured per-layer costs to spec.profile_path once the automatic partition has
  // them (a failure is logged as an event, never fails the job).
  void MaybeWriteProfile();
  enum class Next { kBatch, kAgain, kEnded };
  // The next batch: from the token file or the queue (admitting a waiting feed into the room).
  Next TakeBatch(TensorBatch* batch, int64_t* data_index);

  // A pass reports its progress once it has run this long, then at this interval.
  static constexpr std::chrono::seconds kEvalProgressAfter{2};
  static constexpr std::chrono::seconds kEvalProgressEvery{5};

  EngineJob& job_;
  Controller& c_;
  int64_t steps_ = 0;             // reported in this run
  int64_t skipped_in_a_row_ = 0;  // fp16 steps skipped for overflow, consecutively
  std::optional<int> pending_;    // async: the submitted iteration not yet awaited
  int64_t last_policy_step_;
  int64_t last_eval_step_ = -1;  // the step of the latest evaluation in this run
  bool profile_done_ = false;
};

}  // namespace rp::scheduler::runtime
