// cpu_device.h — the CPU backend: every "stream" is a host thread draining an ordered queue, so
// the full schedule, the event protocol and (later) the consistency protocol run without a GPU
// (CI, and users without one). "Uploads" are deep copies into stage-private tensors, so a
// worker never aliases host-store memory, exactly like a device copy.
//
// Contract: see device.h. Destruction drains and joins the stream threads.
#pragma once

#include "workers/device/device.h"
#include "workers/device/queued_stream.h"

namespace rp::workers {

class CpuStream final : public QueuedStream {
 public:
  CpuStream(int worker, StreamKind kind, Timeline* timeline, DeviceHealth* health);
  ~CpuStream() override;

 private:
  void ThreadBegin() override;
  void RunOp(Op& op) override;

  const int worker_;
  const StreamKind kind_;
  Timeline* const timeline_;
};

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, Timeline* timeline);
  int index() const override { return index_; }
  std::string name() const override { return "cpu:" + std::to_string(index_); }
  c10::Device torch_device() const override { return c10::Device(c10::kCPU); }
  std::string description() const override { return "CPU worker (LibTorch CPU backend)"; }
  Stream& stream(StreamKind kind) override { return *streams_[static_cast<int>(kind)]; }
  std::unique_ptr<Stream> NewStream(StreamKind kind) override;
  DeviceHealth& health() override { return health_; }
  at::Tensor EmptyHost(at::IntArrayRef sizes, at::ScalarType dtype) override;
  at::Tensor Upload(const at::Tensor& host) override;
  at::Tensor Download(const at::Tensor& on_device) override;
  at::Tensor EmptyOnDevice(at::IntArrayRef sizes, at::ScalarType dtype) override;
  void CopyToDevice(const at::Tensor& host_bytes, const at::Tensor& device_bytes) override;

 private:
  const int index_;
  Timeline* const timeline_;
  DeviceHealth health_{index_};
  std::unique_ptr<CpuStream> streams_[kNumStreamKinds];
};

}  // namespace rp::workers
