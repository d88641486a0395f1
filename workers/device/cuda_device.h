// cuda_device.h — the CUDA backend (paper §4.2.1): per worker one compute stream and four copy
// streams (activation up, activation down, parameter up, gradient down), each a real CUDA
// stream driven by its own host thread, so the five issue independently and the GPU overlaps
// copies in both directions with compute.
//
// Ordering model. Every operation of a stream runs on that stream's host thread with the CUDA
// stream current; when it returns, the thread records a CUDA event behind the operation's work
// and waits for it before starting the next one. Hence a host Event recorded by a stream is set
// only once the GPU work before it has *completed*, and a WaitEvent is a host wait on a set
// flag: nothing ever waits on a CUDA event that has not been recorded (the failure mode DESIGN
// §9 warns about), and host consumers (activation store, gradient accumulation, the optimizer)
// never see data still in flight. The price is one host round trip (~10 µs) per operation,
// which at micro-batch granularity is far below 1 % of a stage; operations are whole stage
// phases (one upload chunk, one micro-batch's compute, one download), never single kernels.
// The same CUDA events time each labelled operation, so the timeline and the partitioner's
// profile hold GPU-measured durations.
//
// Memory. Upload copies host -> device asynchronously on the calling stream (pinned sources
// are true DMA) and keeps the source alive until the operation completes; the device copy is
// marked as used by the compute stream (recordStream) so the caching allocator never hands its
// block to another stream early. Download copies device -> a pinned arena block and waits.
//
// Contract: as device.h. Upload/Download must be called from inside an operation of one of
// this device's streams. Construction needs a visible GPU; use CreateDevices.
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "workers/base/mutex.h"
#include "workers/device/device.h"
#include "workers/device/pinned_arena.h"
#include "workers/device/queued_stream.h"

namespace rp::workers {

class CudaDevice;

class CudaStream final : public QueuedStream {
 public:
  CudaStream(CudaDevice* device, StreamKind kind, c10::cuda::CUDAStream stream, Timeline* timeline);
  ~CudaStream() override;

  StreamKind kind() const { return kind_; }
  const c10::cuda::CUDAStream& cuda() const { return stream_; }
  // From this stream's own operations: keep `t` alive until the running operation completed.
  void KeepAlive(at::Tensor t) { keep_alive_.push_back(std::move(t)); }
  // The stream whose operation is running on the calling thread (null elsewhere).
  static CudaStream* Current();
  // From this stream's own operations: the device work of the running operation starts now
  // (the first call counts; the timeline's busy interval begins here).
  void MarkTransferStart();

 private:
  void ThreadBegin() override;
  void ThreadEnd() override;
  void RunOp(Op& op) override;

  CudaDevice* const device_;
  const StreamKind kind_;
  const c10::cuda::CUDAStream stream_;
  Timeline* const timeline_;
  // Stream thread only:
  std::vector<at::Tensor> keep_alive_;
  std::optional<c10::cuda::CUDAGuard> device_guard_;
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard_;
  cudaEvent_t start_ = nullptr, end_ = nullptr;  // timing + completion of the running operation
  bool started_ = false;
  double host_start_ = 0;
};

class CudaDevice final : public Device {
 public:
  // `index`: the worker index; `gpu`: the CUDA device it runs on; `name`: e.g. "cuda:0" (or
  // "cuda:0.1" for the second worker sharing GPU 0).
  CudaDevice(int index, int gpu, std::string name, std::shared_ptr<PinnedArena> arena, const DeviceOptions& options,
             Timeline* timeline);
  ~CudaDevice() override;
  int index() const override { return index_; }
  std::string name() const override { return name_; }
  c10::Device torch_device() const override;
  std::string description() const override { return description_; }
  Stream& stream(StreamKind kind) override { return *streams_[static_cast<int>(kind)]; }
  DeviceHealth& health() override { return health_; }
  std::unique_ptr<Stream> NewStream(StreamKind kind) override;
  at::Tensor EmptyHost(at::IntArrayRef sizes, at::ScalarType dtype) override;
  absl::StatusOr<std::shared_ptr<void>> RegisterHostMemory(void* base, int64_t bytes) override;
  at::Tensor Upload(const at::Tensor& host) override;
  at::Tensor Download(const at::Tensor& on_device) override;
  at::Tensor EmptyOnDevice(at::IntArrayRef sizes, at::ScalarType dtype) override;
  void CopyToDevice(const at::Tensor& host_bytes, const at::Tensor& device_bytes) override;
  bool keeps_weights_resident() const override { return options_.keep_weights_resident; }
  MemoryStats Memory() const override;
  void ResetPeakMemory() override;
  int gpu() const { return gpu_; }

 private:
  std::unique_ptr<CudaStream> MakeStream(StreamKind kind);

  const int index_;
  const int gpu_;
  const std::string name_;
  const std::shared_ptr<PinnedArena> arena_;
  const DeviceOptions options_;
  std::string description_;
  int64_t total_bytes_ = 0;
  Timeline* const timeline_;
  DeviceHealth health_{index_};
  std::unique_ptr<CudaStream> streams_[kNumStreamKinds];
  base::Mutex resident_mu_;
  std::map<const void*, at::Tensor> resident_ ABSL_GUARDED_BY(resident_mu_);  // keep_weights_resident only
};

}  // namespace rp::workers
