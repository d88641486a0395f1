// lane_device.h — one job's lane on a shared device: the device as the job's workers see it,
// with five streams of the job's own (Device::NewStream) and everything else (memory, copies,
// the pacer, transfer counts) the device's. Jobs that run side by side each get a lane on every
// device, so one job's waits never hold another's operations; their compute operations take
// turns through the device's ComputeGate by the jobs' shares.
//
// Contract: the base device and the gate outlive the lane. Destroying the lane drains its
// streams (every operation enqueued on them has run) and then removes its gate lane.
#pragma once

#include <memory>

#include "workers/device/compute_gate.h"
#include "workers/device/device.h"

namespace rp::workers {

class LaneDevice final : public Device {
 public:
  // `share` > 0: the job's weight at the gate (null gate: compute runs without turns — a lane
  // that only re-runs a lost worker's stage slots, scheduler/runtime/slot_recovery.h). `job`: the tag its operations
  // carry into the timeline (OpInfo::job). `pacer` (paced workers only, optional): the job's own clock for its stage
  // compute (a job of another model); copies keep the device's links.
  LaneDevice(Device* base, ComputeGate* gate, double share, int job = -1, const Pacer* pacer = nullptr);
  ~LaneDevice() override;

  int index() const override { return base_->index(); }
  std::string name() const override { return base_->name(); }
  c10::Device torch_device() const override { return base_->torch_device(); }
  Stream& stream(StreamKind kind) override { return *streams_[static_cast<int>(kind)]; }
  std::unique_ptr<Stream> NewStream(StreamKind kind) override { return base_->NewStream(kind); }
  DeviceHealth& health() override { return base_->health(); }
  at::Tensor EmptyHost(at::IntArrayRef sizes, at::ScalarType dtype) override { return base_->EmptyHost(sizes, dtype); }
  absl::StatusOr<std::shared_ptr<void>> RegisterHostMemory(void* base, int64_t bytes) override {
    return base_->RegisterHostMemory(base, bytes);
  }
  at::Tensor Upload(const at::Tensor& host) override { return base_->Upload(host); }
  at::Tensor Download(const at::Tensor& on_device) override { return base_->Download(on_device); }
  at::Tensor EmptyOnDevice(at::IntArrayRef sizes, at::ScalarType dtype) override {
    return base_->EmptyOnDevice(sizes, dtype);
  }
  void CopyToDevice(const at::Tensor& host_bytes, const at::Tensor& device_bytes) override {
    base_->CopyToDevice(host_bytes, device_bytes);
  }
  bool keeps_weights_resident() const override { return base_->keeps_weights_resident(); }
  const Pacer* pacer() const override { return pacer_ != nullptr ? pacer_ : base_->pacer(); }
  MemoryStats Memory() const override { return base_->Memory(); }
  std::string description() const override { return base_->description(); }
  void ResetPeakMemory() override { base_->ResetPeakMemory(); }

  Device* base() const { return base_; }
  int lane() const { return lane_; }
  // The job's compute here so far.
  double compute_seconds() const { return gate_ != nullptr ? gate_->used_seconds(lane_) : 0; }

 private:
  Device* const base_;
  ComputeGate* const gate_;
  const int lane_;
  const Pacer* const pacer_;
  std::unique_ptr<Stream> streams_[kNumStreamKinds];
};

}  // namespace rp::workers
