#include "workers/device/paced_device.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <exception>

namespace rp::workers {
namespace {
// The stream whose thread is running: copies count their bytes against it.
thread_local int paced_stream_kind = static_cast<int>(StreamKind::kParamUp);
}  // namespace

PacedStream::PacedStream(int worker, StreamKind kind, Timeline* timeline, DeviceHealth* health)
    : worker_(worker), kind_(kind), timeline_(timeline) {
  Start(health);
}

PacedStream::~PacedStream() { Stop(); }

void PacedStream::RunOp(Op& op) {
  paced_stream_kind = static_cast<int>(kind_);
  const bool record = timeline_ && !op.info.label.empty();
  double t0 = record ? timeline_->Now() : 0;
  OpClock::Begin(&t0, record ? timeline_ : nullptr);
  try {
    op.fn();  // operations report their own errors (device.h); this is the safety net
  } catch (const std::exception& e) {
    std::fprintf(stderr, "roundpipe: uncaught exception on %s stream of paced:%d: %s\n", StreamKindName(kind_), worker_,
                 e.what());
  }
  OpClock::End();
  if (record) {
    timeline_->Add({worker_, StreamKindName(kind_), std::move(op.info.label), op.info.iteration, op.info.slot,
                    op.info.microbatch, t0, timeline_->Now(), op.info.job});
  }
}

PacedDevice::PacedDevice(int index, std::shared_ptr<const Pacer> pacer, Timeline* timeline)
    : index_(index), pacer_(std::move(pacer)), timeline_(timeline) {
  for (int k = 0; k < kNumStreamKinds; ++k) {
    streams_[k] = std::make_unique<PacedStream>(index, static_cast<StreamKind>(k), timeline, &health_);
  }
}

std::unique_ptr<Stream> PacedDevice::NewStream(StreamKind kind) {
  return std::make_unique<PacedStream>(index_, kind, timeline_, &health_);
}

at::Tensor PacedDevice::EmptyHost(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(c10::kMeta));
}

at::Tensor PacedDevice::Copy(const at::Tensor& t) {
  const int64_t bytes = static_cast<int64_t>(t.nbytes());
  CountTransfer(static_cast<StreamKind>(paced_stream_kind), bytes);
  pacer_->SpendCopy(bytes);
  return at::empty(t.sizes(), t.options().device(c10::kMeta));
}

at::Tensor PacedDevice::Upload(const at::Tensor& host) { return Copy(host); }
at::Tensor PacedDevice::Download(const at::Tensor& on_device) { return Copy(on_device); }

at::Tensor PacedDevice::EmptyOnDevice(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(c10::kMeta));
}

void PacedDevice::CopyToDevice(const at::Tensor& host_bytes, const at::Tensor& device_bytes) {
  (void)device_bytes;
  CountTransfer(static_cast<StreamKind>(paced_stream_kind), host_bytes.numel());
  pacer_->SpendCopy(host_bytes.numel());
}

}  // namespace rp::workers
