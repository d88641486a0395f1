#include "workers/device/cpu_device.h"

#include <cstdio>
#include <exception>

#include <ATen/ATen.h>

#include "workers/device/test_hooks.h"

namespace rp::workers {

const char* StreamKindName(StreamKind k) {
  switch (k) {
    case StreamKind::kCompute:
      return "compute";
    case StreamKind::kActivationUp:
      return "act-up";
    case StreamKind::kActivationDown:
      return "act-down";
    case StreamKind::kParamUp:
      return "param-up";
    case StreamKind::kGradDown:
      return "grad-down";
  }
  return "?";
}

namespace {
// The stream whose thread is running (each CPU stream has its own thread): Upload/Download
// attribute their bytes to it.
thread_local int current_stream_kind = static_cast<int>(StreamKind::kParamUp);
// The running operation's busy start on this stream thread: copy operations start being busy at
// their first transfer, not while they wait on the host (e.g. for another worker's activation).
thread_local double* current_op_start = nullptr;
thread_local const Timeline* current_timeline = nullptr;
thread_local bool current_op_started = false;
void MarkTransferStart() {
  if (current_op_started || current_op_start == nullptr || current_timeline == nullptr) return;
  current_op_started = true;
  *current_op_start = current_timeline->Now();
}
}  // namespace

CpuStream::CpuStream(int worker, StreamKind kind, Timeline* timeline, DeviceHealth* health)
    : worker_(worker), kind_(kind), timeline_(timeline) {
  Start(health);
}

CpuStream::~CpuStream() { Stop(); }

void CpuStream::ThreadBegin() { current_stream_kind = static_cast<int>(kind_); }

void CpuStream::RunOp(Op& op) {
  double t0 = timeline_ && !op.info.label.empty() ? timeline_->Now() : 0;
  current_op_start = &t0;
  current_timeline = timeline_;
  current_op_started = kind_ == StreamKind::kCompute;
  OpClock::Begin(&t0, timeline_ && !op.info.label.empty() ? timeline_ : nullptr);
  try {
    op.fn();  // operations report their own errors (see device.h); this is the safety net
  } catch (const std::exception& e) {
    std::fprintf(stderr, "roundpipe: uncaught exception on %s stream of cpu:%d: %s\n", StreamKindName(kind_), worker_,
                 e.what());
  }
  OpClock::End();
  current_op_start = nullptr;
  if (timeline_ && !op.info.label.empty()) {
    timeline_->Add({worker_, StreamKindName(kind_), std::move(op.info.label), op.info.iteration, op.info.slot,
                    op.info.microbatch, t0, timeline_->Now(), op.info.job});
  }
}

CpuDevice::CpuDevice(int index, Timeline* timeline) : index_(index), timeline_(timeline) {
  for (int k = 0; k < kNumStreamKinds; ++k) {
    streams_[k] = std::make_unique<CpuStream>(index, static_cast<StreamKind>(k), timeline, &health_);
  }
}

std::unique_ptr<Stream> CpuDevice::NewStream(StreamKind kind) {
  return std::make_unique<CpuStream>(index_, kind, timeline_, &health_);
}

at::Tensor CpuDevice::EmptyHost(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype));
}

at::Tensor CpuDevice::Upload(const at::Tensor& host) {
  MarkTransferStart();
  CountTransfer(static_cast<StreamKind>(current_stream_kind), static_cast<int64_t>(host.nbytes()));
  return host.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

at::Tensor CpuDevice::Download(const at::Tensor& on_device) {
  MarkTransferStart();
  CountTransfer(static_cast<StreamKind>(current_stream_kind), static_cast<int64_t>(on_device.nbytes()));
  return on_device.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

at::Tensor CpuDevice::EmptyOnDevice(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype));
}

void CpuDevice::CopyToDevice(const at::Tensor& host_bytes, const at::Tensor& device_bytes) {
  MarkTransferStart();
  CountTransfer(static_cast<StreamKind>(current_stream_kind), host_bytes.numel());
  device_bytes.copy_(host_bytes);
}

}  // namespace rp::workers
