#include "workers/device/queued_stream.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "workers/device/out_of_memory.h"
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

void QueuedStream::Start(DeviceHealth* health) {
  health_ = health;
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

void QueuedStream::Enqueue(OpInfo info, std::function<void()> fn) {
  Push({std::move(info), std::move(fn), Op::Kind::kWork});
}

void QueuedStream::WaitEvent(EventPtr e) {
  Push({{}, [this, e] { WaitOrLost(e); }, Op::Kind::kWait});
}

void QueuedStream::RecordEvent(EventPtr e) {
  Push({{}, [e] { e->Set(); }, Op::Kind::kRecord});
}

void QueuedStream::WaitOrLost(const EventPtr& e) const {
  if (health_ == nullptr) return e->Wait();
  // A lost device's streams must drain even when what they wait for never comes (it was to come
  // from work that died with the device): look at the device now and then. Coarse on purpose:
  // every waiting stream of a working device wakes this often for nothing.
  while (!e->WaitFor(std::chrono::milliseconds(50))) {
    if (health_->lost()) return;
  }
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
    const Fault fault = op.kind == Op::Kind::kWork && health_ != nullptr && !health_->lost()
                            ? MaybeInjectFault(*health_, op.info)
                            : Fault::kNone;
    if (fault == Fault::kDeviceLost) {
      health_->MarkLost(absl::UnavailableError(
          absl::StrCat("device ", health_->device_index(), " lost: fault injected at \"", op.info.label, "\"")));
    }
    const bool lost = health_ != nullptr && health_->lost();
    if (op.kind == Op::Kind::kWork) {
      OutOfMemoryInjectedHere() = fault == Fault::kOutOfMemory;
      if (!lost) RunOp(op);
      OutOfMemoryInjectedHere() = false;
    } else if (op.kind == Op::Kind::kRecord || !lost) {
      op.fn();
    }
  }
  ThreadEnd();
}

}  // namespace rp::workers
