// queued_stream.h — what the CPU and CUDA streams share: an ordered operation queue drained by
// one host thread per stream. Backends say how one operation runs (RunOp); waits and event sets
// are host-only bookkeeping operations in the same queue, so they keep their place in the order.
//
// Contract: Enqueue/WaitEvent/RecordEvent/Synchronize are thread-safe (device.h). A derived
// class calls Start() at the end of its constructor and Stop() first thing in its destructor
// (the thread calls the derived RunOp, so it must not outlive the derived object); Stop drains
// the queue, then joins.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "workers/base/mutex.h"
#include "workers/device/device.h"

namespace rp::workers {

// The recorded start of the operation running on this stream thread (CPU and paced backends,
// whose RunOp brackets each operation with Begin/End): an operation that waits inside its
// function before its device work — a compute turn at the ComputeGate — calls RestartNow, so the
// timeline shows the work and not the wait. No-op on threads without a running operation.
class OpClock {
 public:
  static void Begin(double* start, const Timeline* timeline);
  static void End();
  static void RestartNow();
};

class QueuedStream : public Stream {
 public:
  void Enqueue(OpInfo info, std::function<void()> fn) final;
  void WaitEvent(EventPtr e) final;
  // Set once every operation before it has finished — on CUDA, finished on the GPU too.
  void RecordEvent(EventPtr e) final;
  void Synchronize() final;

 protected:
  struct Op {
    OpInfo info;
    std::function<void()> fn;
    enum class Kind { kWork, kWait, kRecord };
    Kind kind = Kind::kWork;  // kWait / kRecord: host-only bookkeeping
  };
  // `health`: the device's (outlives the stream). Once it is lost, work is skipped and waits end
  // at once (within 50 ms for one already waiting); events are still set.
  void Start(DeviceHealth* health);
  void Stop();
  virtual void ThreadBegin() {}
  virtual void ThreadEnd() {}
  // Runs one device operation on the stream thread (host-only operations just run their fn).
  virtual void RunOp(Op& op) = 0;

 private:
  void Push(Op op);
  void Loop();
  // A wait that ends when `e` is set or the device is lost.
  void WaitOrLost(const EventPtr& e) const;

  DeviceHealth* health_ = nullptr;
  base::Mutex mu_;
  base::CondVar cv_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rp::workers
