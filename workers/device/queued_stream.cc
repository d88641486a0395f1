#include "workers/device/queued_stream.h"

#include "workers/device/test_hooks.h"

namespace rp::workers {

namespace {
thread_local double* op_clock_start = nullptr;
thread_local const Timeline* op_clock_timeline = nullptr;
}  // namespace

void OpClock::Begin(double* start, const Timeline* timeline) {
  op_clock_start = start;
  op_clock_timeline = timeline;
}

void OpClock::End() {
  op_clock_start = nullptr;
  op_clock_timeline = nullptr;
}

void OpClock::RestartNow() {
  if (op_clock_start != nullptr && op_clock_timeline != nullptr) *op_clock_start = op_clock_timeline->Now();
}

void QueuedStream::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void QueuedStream::Stop() {
  if (!thread_.joinable()) return;
  {
    base::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

void QueuedStream::Push(Op op) {
  bool was_empty = false;
  {
    base::MutexLock lock(&mu_);
    was_empty = queue_.empty();
    queue_.push_back(std::move(op));
  }
  // The stream thread waits only on an empty queue (Loop checks under the lock), so only the
  // first operation after it emptied needs to wake it: a dispatch that enqueues a stage's
  // hundred operations costs one wake-up per stream, not a hundred.
  if (was_empty) cv_.SignalAll();
}

void QueuedStream::Enqueue(OpInfo info, std::function<void()> fn) { Push({std::move(info), std::move(fn), true}); }

void QueuedStream::WaitEvent(EventPtr e) {
  Push({{}, [e] { e->Wait(); }, false});
}

void QueuedStream::RecordEvent(EventPtr e) {
  Push({{}, [e] { e->Set(); }, false});
}

void QueuedStream::Synchronize() {
  auto e = MakeEvent();
  RecordEvent(e);
  e->Wait();
}

void QueuedStream::Loop() {
  ThreadBegin();
  for (;;) {
    Op op;
    {
      base::MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) break;  // stop requested and drained
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    MaybeDelayForTest();  // race-hunting tests: a random delay before any operation
    if (op.device_work) {
      RunOp(op);
    } else {
      op.fn();
    }
  }
  ThreadEnd();
}

}  // namespace rp::workers
