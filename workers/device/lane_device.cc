#include "workers/device/lane_device.h"

#include <atomic>
#include <memory>
#include <utility>

#include "workers/device/queued_stream.h"

namespace rp::workers {

namespace {

// The lane's compute stream: each operation runs in its job's turn at the device's gate. Waits
// and event records keep their place in the stream's order and never take a turn.
class GatedStream final : public Stream {
 public:
  GatedStream(std::unique_ptr<Stream> inner, ComputeGate* gate, int lane)
      : inner_(std::move(inner)), gate_(gate), lane_(lane) {}
  void Enqueue(OpInfo info, std::function<void()> fn) override {
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
  ComputeGate* const gate_;
  const int lane_;
  // Compute operations enqueued and not yet started (shared with them: they outlive no stream).
  std::shared_ptr<std::atomic<int>> queued_ = std::make_shared<std::atomic<int>>(0);
};

}  // namespace

LaneDevice::LaneDevice(Device* base, ComputeGate* gate, double share, const Pacer* pacer)
    : base_(base), gate_(gate), lane_(gate->AddLane(share)), pacer_(pacer) {
  for (int k = 0; k < kNumStreamKinds; ++k) {
    const auto kind = static_cast<StreamKind>(k);
    std::unique_ptr<Stream> s = base_->NewStream(kind);
    if (kind == StreamKind::kCompute) s = std::make_unique<GatedStream>(std::move(s), gate_, lane_);
    streams_[k] = std::move(s);
  }
}

LaneDevice::~LaneDevice() {
  for (auto& s : streams_) s.reset();  // drains: nothing of this lane runs or waits after
  gate_->RemoveLane(lane_);
}

}  // namespace rp::workers
