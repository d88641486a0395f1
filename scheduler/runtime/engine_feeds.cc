// The engine's input side (engine_impl.h): batches fed to a streamed job's bounded queue, each
// checked against the job once (AcceptFeed), waiting for room synchronously (FeedBatch) or
// parked until the runner makes room (FeedBatchAsync), and the end of a job's input.
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/runtime/engine_impl.h"
#include "scheduler/runtime/tensor_batch.h"

namespace rp::scheduler {

namespace {
// A job that takes no more batches, in the words every feed uses.
bool Closed(const runtime::EngineJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return job.input_closed || job.terminal() || job.cancel;
}
absl::Status ClosedError(const runtime::EngineJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return absl::FailedPreconditionError(
      absl::StrCat("job ", job.id, " accepts no more batches (", JobStateName(job.state), ")"));
}
bool HasRoom(const runtime::EngineJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return job.waiting.empty() && static_cast<int>(job.batches.size()) < job.spec.max_queued_batches;
}
}  // namespace

absl::StatusOr<std::pair<std::shared_ptr<Engine::Impl::Job>, runtime::TensorBatch>> Engine::Impl::AcceptFeed(
    JobId id, const Batch& batch) const {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  if (job->spec.token_file) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " reads a token file; it takes no streamed batches"));
  }
  {
    base::MutexLock lock(&job->mu);
    if (Closed(*job)) return ClosedError(*job);
  }
  // Against the spec (vocab, micro-batches): a queued job has no controller yet.
  if (absl::Status st = runtime::ValidateBatch(batch, job->model.vocab, job->spec.microbatches); !st.ok()) return st;
  runtime::TensorBatch t = runtime::ToTensors(batch);
  t.validated = true;
  return std::make_pair(job, std::move(t));
}

absl::Status Engine::Impl::FeedBatch(JobId id, Batch batch, std::chrono::milliseconds timeout) {
  auto accepted = AcceptFeed(id, batch);
  if (!accepted.ok()) return accepted.status();
  const std::shared_ptr<Job> job = accepted->first;  // (named: a lambda below uses it)
  runtime::TensorBatch& t = accepted->second;
  base::MutexLock lock(&job->mu);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!Closed(*job) && !HasRoom(*job)) {
    if (!job->cv.WaitUntil(&job->mu, deadline)) break;
  }
  const bool room = HasRoom(*job);
  if (Closed(*job)) return ClosedError(*job);
  if (!room) {
    return absl::DeadlineExceededError(
        absl::StrCat("job ", id, ": batch queue still full after ", timeout.count(), " ms"));
  }
  job->batches.push_back(std::move(t));
  job->cv.SignalAll();
  return absl::OkStatus();
}

absl::Status Engine::Impl::FeedBatchAsync(JobId id, Batch batch, std::function<void(absl::Status)> done) {
  auto accepted = AcceptFeed(id, batch);
  if (!accepted.ok()) return accepted.status();
  const std::shared_ptr<Job> job = accepted->first;
  runtime::TensorBatch& t = accepted->second;
  {
    base::MutexLock lock(&job->mu);
    if (Closed(*job)) return ClosedError(*job);
    if (HasRoom(*job)) {
      job->batches.push_back(std::move(t));
      job->cv.SignalAll();
    } else if (static_cast<int>(job->waiting.size()) < job->spec.max_queued_batches) {
      job->waiting.push_back({std::move(t), std::move(done)});  // the runner admits it when there is room
      return absl::OkStatus();
    } else {
      return absl::ResourceExhaustedError(absl::StrCat("job ", id, ": ", job->batches.size(), " batches queued and ",
                                                       job->waiting.size(),
                                                       " waiting for room (the job's limit); retry later"));
    }
  }
  done(absl::OkStatus());
  return absl::OkStatus();
}

absl::Status Engine::Impl::CloseInput(JobId id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  base::MutexLock lock(&job->mu);
  job->input_closed = true;
  job->cv.SignalAll();
  return absl::OkStatus();
}

}  // namespace rp::scheduler
