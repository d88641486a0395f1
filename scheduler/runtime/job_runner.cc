#include "scheduler/runtime/job_runner.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/profile_file.h"
#include "scheduler/runtime/job_samples.h"
#include "workers/files/confined_fs.h"

namespace rp::scheduler::runtime {

JobRunner::JobRunner(EngineJob& job) : job_(job), c_(*job.controller), last_policy_step_(job.first_step) {
  base::MutexLock lock(&job_.mu);
  // A resumed job that was evaluated at its checkpoint's step is not evaluated there again.
  if (job_.last_eval && job_.last_eval->step == job_.first_step) last_eval_step_ = job_.first_step;
}

void JobRunner::RunGeneration() {
  auto cancelled = [this] {
    base::MutexLock lock(&job_.mu);
    return job_.cancel;
  };
  absl::StatusOr<std::vector<GeneratedSample>> out;
  {
    base::MutexLock run(&job_.run_mu);
    out = GenerateSamples(c_, job_.spec.eval.samples, job_.sample_tokenizer.get(), c_.microbatches(), cancelled);
  }
  base::MutexLock lock(&job_.mu);
  const JobState s = out.ok()                          ? JobState::kSucceeded
                     : absl::IsCancelled(out.status()) ? JobState::kCancelled
                                                       : JobState::kFailed;
  std::string why = out.ok() ? "" : std::string(out.status().message());
  job_.generated = std::move(out);
  job_.SetState(s, std::move(why));
}

bool JobRunner::FinishPending() {
  if (!pending_) return true;
  absl::StatusOr<IterationStats> st;
  {
    base::MutexLock run(&job_.run_mu);
    st = c_.AwaitIteration(*pending_);
  }
  pending_.reset();
  base::MutexLock lock(&job_.mu);
  if (!st.ok()) {
    job_.SetState(JobState::kFailed, std::string(st.status().message()));
    return false;
  }
  ++steps_;
  ++job_.steps_done;
  st->host_state_bytes = job_.store->HostBytes() + c_.OptimizerStateBytes();
  job_.peak_host_state_bytes = std::max(job_.peak_host_state_bytes, st->host_state_bytes);
  job_.peak_activation_bytes = std::max(job_.peak_activation_bytes, st->activation_peak_bytes);
  for (const PlanChange& c : st->plan_changes) {
    JobEvent ev{JobEvent::Kind::kPlanChange, job_.state, {}, c.detail};
    ev.plan_change = c;
    job_.Emit(std::move(ev));
  }
  job_.Emit({JobEvent::Kind::kIteration, job_.state, *st, ""});
  if (!profile_done_ && !job_.spec.profile_path.empty() && c_.measured_costs()) {
    lock.Unlock();
    MaybeWriteProfile();
    lock.Lock();
  }
  const int64_t step = job_.first_step + job_.steps_done;
  skipped_in_a_row_ = st->skipped_step ? skipped_in_a_row_ + 1 : 0;
  if (st->skipped_step && (st->loss_scale <= 1.0 || skipped_in_a_row_ >= kMaxConsecutiveSkippedSteps)) {
    job_.SetState(JobState::kFailed,
                  absl::StrCat("training diverged at step ", step, ": ", skipped_in_a_row_,
                               " step(s) in a row overflowed in fp16 (loss ", st->loss, ", loss scale ", st->loss_scale,
                               "); lower the learning rate or train in bf16"));
    return false;
  }
  if (!st->skipped_step && !std::isfinite(st->loss)) {
    job_.SetState(JobState::kFailed, absl::StrCat("training diverged at step ", step, ": the loss is ", st->loss,
                                                  "; lower the learning rate"));
    return false;
  }
  return true;
}

bool JobRunner::End(JobState s, std::string message) {
  if (!FinishPending()) return true;  // already FAILED
  if (s == JobState::kSucceeded && job_.validation) {
    int64_t step;
    {
      base::MutexLock lock(&job_.mu);
      step = job_.first_step + job_.steps_done;
    }
    if (step != last_eval_step_) {
      switch (Evaluate(/*at_end=*/true)) {
        case EvalOutcome::kEnded:
          return true;
        case EvalOutcome::kInterrupted: {
          base::MutexLock lock(&job_.mu);
          if (!job_.cancel) return false;  // paused: the loop pauses, then ends the job again
          s = JobState::kCancelled;
          message = "cancelled during the final evaluation";
          break;
        }
        case EvalOutcome::kDone:
          break;
      }
    }
  }
  {
    base::MutexLock run(&job_.run_mu);
    (void)c_.Flush();  // the store now holds every step
    // A daemon job's final weights go to disk before it is reported ended: export works after
    // any restart, and the host state can be released (ReleaseEnded).
    if (!job_.spec.checkpoint_root.empty()) {
      // Every node of a data-parallel job ends its run at the same step when it succeeds.
      auto info = job_.CheckpointNow("final", /*report_existing=*/false, s == JobState::kSucceeded);
      if (info.ok()) job_.final_checkpoint = info->path;
    }
  }
  base::MutexLock lock(&job_.mu);
  job_.SetState(s, std::move(message));
  return true;
}

bool JobRunner::TakeCheckpoints() {
  std::deque<EngineJob::CheckpointRequest> reqs;
  {
    base::MutexLock lock(&job_.mu);
    if (job_.checkpoints.empty()) return true;
    reqs.swap(job_.checkpoints);
  }
  const bool ok = FinishPending();
  base::MutexLock run(&job_.run_mu);
  if (ok) (void)c_.Flush();
  for (auto& r : reqs) {
    if (!ok) {
      if (r.done) r.done->set_value(absl::FailedPreconditionError("the job failed before the checkpoint"));
      continue;
    }
    auto info = job_.CheckpointNow(r.note, true, /*on_every_node=*/!r.done);  // the policy's: a step every node takes
    {
      base::MutexLock lock(&job_.mu);
      if (!r.done) {  // the policy: a disk that keeps failing pauses the job instead of losing its progress
        job_.checkpoint_failures = info.ok() ? 0 : job_.checkpoint_failures + 1;
        if (job_.checkpoint_failures >= kMaxCheckpointFailures && !job_.cancel) {
          job_.pause = true;
          job_.pause_reason = absl::StrCat("paused after ", job_.checkpoint_failures,
                                           " checkpoints in a row failed (last: ", info.status().message(),
                                           "); fix the output directory, then resume");
          job_.checkpoint_failures = 0;
        }
      }
    }
    if (r.done) r.done->set_value(info);
  }
  return ok;
}

void JobRunner::PolicyCheckpoint() {
  if (job_.spec.checkpoint_every <= 0) return;
  const int64_t submitted = job_.first_step + steps_ + (pending_ ? 1 : 0);
  if (submitted == last_policy_step_ || submitted % job_.spec.checkpoint_every != 0) return;
  last_policy_step_ = submitted;
  base::MutexLock lock(&job_.mu);
  job_.checkpoints.push_back({"every " + std::to_string(job_.spec.checkpoint_every) + " steps_", nullptr});
}

bool JobRunner::Cancelled() {
  base::MutexLock lock(&job_.mu);
  return job_.cancel;
}

bool JobRunner::MaybePause() {
  {
    base::MutexLock lock(&job_.mu);
    if (!job_.pause || job_.cancel) return true;
  }
  if (!FinishPending()) return false;
  {
    base::MutexLock run(&job_.run_mu);
    (void)c_.Flush();
  }
  base::MutexLock lock(&job_.mu);
  const auto cause = job_.pause_reason.empty() ? JobEvent::PauseCause::kRequested : JobEvent::PauseCause::kByEngine;
  job_.SetState(JobState::kPaused, std::exchange(job_.pause_reason, ""), cause);
  for (;;) {
    while (job_.pause && !job_.cancel && job_.checkpoints.empty()) job_.cv.Wait(&job_.mu);
    if (job_.checkpoints.empty()) break;
    // Checkpoints asked for while paused are served now (TakeCheckpoints takes both locks).
    lock.Unlock();
    const bool ok = TakeCheckpoints();
    lock.Lock();
    if (!ok) return false;
  }
  if (!job_.cancel) job_.SetState(JobState::kRunning);
  return true;
}

void JobRunner::MaybeWriteProfile() {
  profile_done_ = true;
  planning::Profile p;
  p.costs = *c_.measured_costs();
  p.activation_hop_s = c_.measured_activation_hop_s();
  p.name = absl::StrCat("job ", job_.id, ": ", job_.model.num_blocks, " blocks, hidden ", job_.model.hidden, ", ",
                        c_.measured_microbatch_rows(), " x ", c_.measured_sequence_length(),
                        " tokens per micro-batch, measured on ", c_.num_workers(), " worker(s)");
  const std::string& path = job_.spec.profile_path;
  const std::string tmp = absl::StrCat(path, ".tmp-", job_.id);
  (void)files::RemoveTree(tmp);
  absl::Status st = files::WriteNewFile(tmp, planning::ProfileJson(p));
  if (st.ok() && files::KindOf(path) == files::FileKind::kFile) st = files::RemoveTree(path);
  if (st.ok()) st = files::RenameNoReplace(tmp, path);
  base::MutexLock lock(&job_.mu);
  if (!st.ok()) {
    (void)files::RemoveTree(tmp);
    job_.Emit(
        {JobEvent::Kind::kProfileFailed, job_.state, {}, absl::StrCat("could not write the profile: ", st.message())});
    return;
  }
  job_.profile_written = path;
  job_.Emit({JobEvent::Kind::kProfile, job_.state, {}, path});
}

JobRunner::EvalOutcome JobRunner::MaybeEvaluate() {
  const int64_t every = job_.spec.eval.every_steps;
  if (!job_.validation || every <= 0) return EvalOutcome::kDone;
  const int64_t submitted = job_.first_step + steps_ + (pending_ ? 1 : 0);
  if (submitted == 0 || submitted == last_eval_step_ || submitted % every != 0) return EvalOutcome::kDone;
  return Evaluate(/*at_end=*/false);
}

JobRunner::EvalOutcome JobRunner::RunEvalPass(int64_t step, std::chrono::steady_clock::time_point t0, EvalPass* pass) {
  const int64_t batches = job_.validation->batches_per_epoch();
  auto last_report = t0;
  {
    base::MutexLock run(&job_.run_mu);
    for (int64_t b = 0; b < batches; ++b) {
      {
        base::MutexLock lock(&job_.mu);
        if (job_.cancel || job_.pause) return EvalOutcome::kInterrupted;
        const auto now = std::chrono::steady_clock::now();
        if (now - t0 >= kEvalProgressAfter && now - last_report >= kEvalProgressEvery) {
          last_report = now;
          std::string what = absl::StrCat("evaluating at step ", step, ": validation batch ", b + 1, " of ", batches);
          job_.message = what;
          job_.Emit({JobEvent::Kind::kProgress, job_.state, {}, std::move(what)});
        }
      }
      auto [tokens_b, labels_b] = job_.validation->Batch(b);
      const at::Tensor positions = job_.validation->Positions(b);
      auto r =
          c_.Evaluate(tokens_b, labels_b, positions.defined() ? std::optional<at::Tensor>(positions) : std::nullopt);
      if (!r.ok()) {
        base::MutexLock lock(&job_.mu);
        job_.SetState(JobState::kFailed,
                      absl::StrCat("evaluation at step ", step, ", validation batch ", b, ": ", r.status().message()));
        return EvalOutcome::kEnded;
      }
      pass->sum += r->loss_sum;
      pass->tokens += r->tokens;
    }
    if (!job_.spec.eval.samples.prompts.empty()) {
      auto interrupted = [this] {
        base::MutexLock lock(&job_.mu);
        return job_.cancel || job_.pause;
      };
      auto generated =
          GenerateSamples(c_, job_.spec.eval.samples, job_.sample_tokenizer.get(), c_.microbatches(), interrupted);
      if (absl::IsCancelled(generated.status())) return EvalOutcome::kInterrupted;  // like the pass
      if (!generated.ok()) {
        base::MutexLock lock(&job_.mu);
        job_.SetState(JobState::kFailed,
                      absl::StrCat("sample generation at step ", step, ": ", generated.status().message()));
        return EvalOutcome::kEnded;
      }
      pass->samples = std::move(*generated);
    }
  }
  return EvalOutcome::kDone;
}

JobRunner::EvalOutcome JobRunner::Evaluate(bool at_end) {
  if (!FinishPending()) return EvalOutcome::kEnded;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t step;
  {
    base::MutexLock lock(&job_.mu);
    step = job_.first_step + job_.steps_done;
  }
  const int64_t previous_eval_step = std::exchange(last_eval_step_, step);
  EvalPass pass;
  if (const EvalOutcome o = RunEvalPass(step, t0, &pass); o != EvalOutcome::kDone) {
    if (o == EvalOutcome::kInterrupted)
      last_eval_step_ = previous_eval_step;  // abandoned: evaluated again at this step
    return o;
  }
  const double sum = pass.sum;
  const int64_t tokens = pass.tokens;
  std::vector<GeneratedSample> samples = std::move(pass.samples);
  base::MutexLock lock(&job_.mu);
  if (tokens == 0) {
    job_.SetState(JobState::kFailed, "data.validation: no token of the validation set has a label to evaluate");
    return EvalOutcome::kEnded;
  }
  EvalStats ev;
  ev.step = step;
  ev.loss = sum / static_cast<double>(tokens);
  ev.tokens = tokens;
  ev.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ev.samples = std::move(samples);
  const bool had_best = job_.last_eval.has_value();
  ev.is_best = !had_best || ev.loss < job_.last_eval->best_loss;
  ev.best_loss = ev.is_best ? ev.loss : job_.last_eval->best_loss;
  ev.best_step = ev.is_best ? step : job_.last_eval->best_step;
  job_.evals_without_improvement = ev.is_best ? 0 : job_.evals_without_improvement + 1;
  if (ev.is_best && job_.spec.eval.keep_best_checkpoint) {
    lock.Unlock();
    absl::StatusOr<CheckpointInfo> info;
    {
      base::MutexLock run(&job_.run_mu);
      info = job_.CheckpointNow(absl::StrCat("best eval loss ", ev.loss), /*report_existing=*/false);
    }
    lock.Lock();
    if (info.ok()) {  // a failure was reported; the last best stays kept
      job_.best_checkpoint = info->path;
      ev.checkpoint = info->path;
    }
  }
  job_.last_eval = ev;
  JobEvent e{JobEvent::Kind::kEval, job_.state, {}, ""};
  e.eval = ev;
  job_.Emit(e);
  const int patience = job_.spec.eval.early_stopping_patience;
  if (!at_end && patience > 0 && job_.evals_without_improvement >= patience) {
    const std::string why =
        absl::StrCat("stopped early at step ", step, ": the eval loss did not improve for ", patience,
                     " evaluation(s) (best ", ev.best_loss, " at step ", ev.best_step, ")");
    lock.Unlock();
    End(JobState::kSucceeded, why);  // evaluated at this step: End does not evaluate again
    return EvalOutcome::kEnded;
  }
  return EvalOutcome::kDone;
}

JobRunner::Next JobRunner::TakeBatch(TensorBatch* batch, int64_t* data_index) {
  if (job_.data) {
    base::MutexLock lock(&job_.mu);
    if ((job_.pause || !job_.checkpoints.empty()) && !job_.cancel) return Next::kAgain;
    const int64_t index = job_.consumed_offset + job_.consumed;
    if (job_.cancel || index >= job_.data->batches_per_epoch() * job_.spec.token_file->max_epochs) {
      const bool cancelled = job_.cancel;
      lock.Unlock();
      return End(cancelled ? JobState::kCancelled : JobState::kSucceeded, cancelled ? "cancelled" : "") ? Next::kEnded
                                                                                                        : Next::kAgain;
    }
    ++job_.consumed;
    lock.Unlock();
    auto [tokens, labels] = job_.data->Batch(index);
    *batch = {tokens, labels};
    if (at::Tensor positions = job_.data->Positions(index); positions.defined()) batch->positions = positions;
    *data_index = index;
  } else {
    base::MutexLock lock(&job_.mu);
    const bool idle = job_.batches.empty() && !job_.cancel && !job_.input_closed;
    if (idle && pending_) {
      // Nothing to overlap with: report the pending iteration now instead of holding it.
      lock.Unlock();
      return FinishPending() ? Next::kAgain : Next::kEnded;
    }
    while (!job_.cancel && !job_.pause && !job_.input_closed && job_.batches.empty() && job_.checkpoints.empty()) {
      job_.cv.Wait(&job_.mu);
    }
    if ((job_.pause || !job_.checkpoints.empty()) && !job_.cancel) return Next::kAgain;
    if (job_.cancel || job_.batches.empty()) {
      const bool cancelled = job_.cancel;
      lock.Unlock();
      return End(cancelled ? JobState::kCancelled : JobState::kSucceeded, cancelled ? "cancelled" : "") ? Next::kEnded
                                                                                                        : Next::kAgain;
    }
    *batch = std::move(job_.batches.front());
    job_.batches.pop_front();
    ++job_.consumed;
    // Room in the queue: the oldest waiting asynchronous feed takes it.
    std::function<void(absl::Status)> admitted;
    if (!job_.waiting.empty()) {
      job_.batches.push_back(std::move(job_.waiting.front().batch));
      admitted = std::move(job_.waiting.front().done);
      job_.waiting.pop_front();
    }
    job_.cv.SignalAll();  // room for FeedBatch
    lock.Unlock();
    if (admitted) admitted(absl::OkStatus());
  }
  return Next::kBatch;
}

void JobRunner::Run() {
  {
    base::MutexLock lock(&job_.mu);
    if (job_.terminal()) return;  // cancelled while queued
    if (job_.state != JobState::kRunning) job_.SetState(JobState::kRunning);
  }
  if (job_.generation_only) {
    RunGeneration();
    return;
  }
  for (;;) {
    PolicyCheckpoint();
    if (!TakeCheckpoints()) return;
    if (!MaybePause()) return;
    const EvalOutcome eval = MaybeEvaluate();
    if (eval == EvalOutcome::kEnded) return;
    if (eval == EvalOutcome::kInterrupted && !Cancelled()) continue;  // paused: pause, then the pass again
    if (job_.spec.max_steps > 0 && steps_ + (pending_ ? 1 : 0) >= job_.spec.max_steps) {
      if (End(JobState::kSucceeded, "")) return;
      continue;  // the final evaluation was paused: pause, then end after the resume
    }
    TensorBatch batch;
    int64_t data_index = -1;  // token-file jobs: the batch's index in the file
    const Next next = TakeBatch(&batch, &data_index);
    if (next == Next::kEnded) return;
    if (next == Next::kAgain) continue;
    absl::StatusOr<int> it;
    {
      base::MutexLock run(&job_.run_mu);
      it = c_.SubmitIteration(batch.tokens, batch.labels, batch.positions, batch.validated);
    }
    if (!it.ok()) {
      base::MutexLock lock(&job_.mu);
      if (it.status().code() == absl::StatusCode::kInvalidArgument && data_index >= 0) {
        job_.SetState(JobState::kFailed, absl::StrCat("token file batch ", data_index, ": ", it.status().message()));
        return;
      }
      if (it.status().code() == absl::StatusCode::kInvalidArgument) {
        job_.Emit({JobEvent::Kind::kBatchRejected, job_.state, {}, std::string(it.status().message())});
        continue;
      }
      job_.SetState(JobState::kFailed, std::string(it.status().message()));
      return;
    }
    // Sync: the iteration is complete already. Async: keep it in flight while the next one is
    // submitted, then report the older one.
    if (!FinishPending()) return;
    pending_ = *it;
    if (job_.spec.optimizer_mode == planning::OptimizerMode::kSync && !FinishPending()) return;
  }
}

}  // namespace rp::scheduler::runtime
