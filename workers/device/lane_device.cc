#include "workers/device/lane_device.h"

#include <atomic>
#include <memory>
#include <utility>

#include "workers/device/queued_stream.h"

namespace rp::workers {

namespace {

// A lane's stream: every operation is tagged with the lane's job (the timeline tells the jobs
// apart); on the compute stream each one also runs in its job's turn at the device's gate. Waits
// and event records keep their place in the stream's order and never take a turn.
class LaneStream final : public Stream {
 public:
  LaneStream(std::unique_ptr<Stream> inner, int job, ComputeGate* gate, int lane)
      : inner_(std::move(inner)), job_(job), gate_(gate), lane_(lane) {}
  void Enqueue(OpInfo info, std::function<void()> fn) override {
    info.job = job_;
    if (gate_ == nullptr) {
      inner_->Enqueue(std::move(info), std::move(fn));
      return;
    }
    queued_->fetch_add(1);
    inner_->Enqueue(std::move(info), [gate = gate_, lane = lane_, queued = queued_, fn = std::move(fn)] {
      queued->fetch_sub(1);  // this one runs; what remains is queued behind it
      gate->Run(
          lane,
          [&fn] {
            OpClock::RestartNow();  // the turn came: the work starts now (the timeline shows no wait)
            fn();
          },
          [&queued] { return queued->load() > 0; });
    });
  }
  void WaitEvent(EventPtr e) override { inner_->WaitEvent(std::move(e)); }
  void RecordEvent(EventPtr e) override { inner_->RecordEvent(std::move(e)); }
  void Synchronize() override { inner_->Synchronize(); }

 private:
  std::unique_ptr<Stream> inner_;
  const int job_;
  ComputeGate* const gate_;  // compute stream only
  const int lane_;
  // Compute operations enqueued and not yet started (shared with them: they outlive no stream).
  std::shared_ptr<std::atomic<int>> queued_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace

LaneDevice::LaneDevice(Device* base, ComputeGate* gate, double share, int job, const Pacer* pacer)
    : base_(base), gate_(gate), lane_(gate != nullptr ? gate->AddLane(share) : -1), pacer_(pacer) {
  for (int k = 0; k < kNumStreamKinds; ++k) {
    const auto kind = static_cast<StreamKind>(k);
    streams_[k] = std::make_unique<LaneStream>(base_->NewStream(kind), job,
                                               kind == StreamKind::kCompute ? gate_ : nullptr, lane_);
  }
}

LaneDevice::~LaneDevice() {
  for (auto& s : streams_) s.reset();  // drains: nothing of this lane runs or waits after
  if (gate_ != nullptr) gate_->RemoveLane(lane_);
}

}  // namespace rp::workers
