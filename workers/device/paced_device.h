// paced_device.h — the paced backend (`paced:N`): N workers whose five streams keep the
// schedule of real devices while no data moves. Tensors on a paced worker live on the meta
// device (shapes and byte counts, no memory); a copy takes bytes / link bandwidth and a stage
// slot's compute the profile's time (pacer.h), both at the Pacer's time scale. With a
// data-free host store (HostModelStore::DataFree) the real controller, dispatch plan,
// consistency protocol, activation store and optimizer worker run a paper-scale model in
// milliseconds of CPU: a benchmark of the scheduling code, never a training backend.
//
// Contract: see device.h. Upload / Download / CopyToDevice are called from stream operations
// and sleep on the calling stream's thread; EmptyHost and EmptyOnDevice return meta tensors.
// The Pacer outlives the devices. Destruction drains and joins the stream threads.
#pragma once

#include <memory>

#include "workers/device/device.h"
#include "workers/device/pacer.h"
#include "workers/device/queued_stream.h"

namespace rp::workers {

class PacedStream final : public QueuedStream {
 public:
  PacedStream(int worker, StreamKind kind, Timeline* timeline, DeviceHealth* health);
  ~PacedStream() override;

 private:
  void RunOp(Op& op) override;

  const int worker_;
  const StreamKind kind_;
  Timeline* const timeline_;
};

class PacedDevice final : public Device {
 public:
  PacedDevice(int index, std::shared_ptr<const Pacer> pacer, Timeline* timeline);
  int index() const override { return index_; }
  std::string name() const override { return "paced:" + std::to_string(index_); }
  c10::Device torch_device() const override { return c10::Device(c10::kMeta); }
  std::string description() const override { return "paced worker (no data; times from a profile)"; }
  Stream& stream(StreamKind kind) override { return *streams_[static_cast<int>(kind)]; }
  std::unique_ptr<Stream> NewStream(StreamKind kind) override;
  DeviceHealth& health() override { return health_; }
  const Pacer* pacer() const override { return pacer_.get(); }
  at::Tensor EmptyHost(at::IntArrayRef sizes, at::ScalarType dtype) override;
  at::Tensor Upload(const at::Tensor& host) override;
  at::Tensor Download(const at::Tensor& on_device) override;
  at::Tensor EmptyOnDevice(at::IntArrayRef sizes, at::ScalarType dtype) override;
  void CopyToDevice(const at::Tensor& host_bytes, const at::Tensor& device_bytes) override;

 private:
  at::Tensor Copy(const at::Tensor& t);

  const int index_;
  const std::shared_ptr<const Pacer> pacer_;
  Timeline* const timeline_;
  DeviceHealth health_{index_};
  std::unique_ptr<PacedStream> streams_[kNumStreamKinds];
};

}  // namespace rp::workers
