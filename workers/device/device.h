// device.h — the device backend interface: one compute stream and four copy streams per device
// (activation upload, activation download, parameter upload, gradient download), with
// host-visible events between them (paper §4.2.1, ARCHITECTURE §4).
//
// Contract: a Stream executes its operations one at a time in enqueue order, asynchronously to
// the caller; Enqueue/WaitEvent/RecordEvent are thread-safe. Operations report their own
// failures (the DeviceWorker wraps each one and records the first error in the job's RunContext);
// an exception that still escapes is caught by the stream, printed, and the stream goes on.
// Devices are owned by the engine and outlive every task enqueued on them.
// Backends: CpuDevice (cpu_device.h), CudaDevice (cuda_device.h) and, for benchmarks of the
// schedule only, PacedDevice (paced_device.h). A host Event set by a
// stream always means "the work before it has completed" on either backend.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workers/device/device_health.h"
#include "workers/device/event.h"
#include "workers/device/pacer.h"
#include "workers/device/timeline.h"

namespace rp::workers {

enum class StreamKind { kCompute = 0, kActivationUp = 1, kActivationDown = 2, kParamUp = 3, kGradDown = 4 };
inline constexpr int kNumStreamKinds = 5;
const char* StreamKindName(StreamKind k);

// What the timeline records about an operation (label empty: not recorded).
struct OpInfo {
  std::string label;
  int iteration = -1;
  int slot = -1;
  int microbatch = -1;
  int job = -1;  // set by a job's lane (lane_device.h): whose operation it is
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual void Enqueue(OpInfo info, std::function<void()> fn) = 0;
  // Later operations on this stream start only after `e` is set.
  virtual void WaitEvent(EventPtr e) = 0;
  // `e` is set once every operation enqueued before has finished.
  virtual void RecordEvent(EventPtr e) = 0;
  // Blocks the caller until everything enqueued so far has finished.
  virtual void Synchronize() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual int index() const = 0;
  virtual std::string name() const = 0;          // "cpu:0", "cuda:1"
  virtual c10::Device torch_device() const = 0;  // where stage tensors live while a stage runs
  virtual Stream& stream(StreamKind kind) = 0;
  // A further stream of `kind` on this device, owned by the caller (destroying it drains it):
  // what a job's lane (lane_device.h) runs on, so that jobs sharing the device never queue
  // behind each other's waits. On CUDA a new stream from the pool (same priority as the
  // device's own stream of that kind).
  virtual std::unique_ptr<Stream> NewStream(StreamKind kind) = 0;
  // Whether the device still works (device_health.h): shared by every stream made on it and by
  // every lane over it.
  virtual DeviceHealth& health() = 0;

  // Host memory the device copies from and to asynchronously: page-locked on CUDA (from a
  // pinned arena), ordinary memory on the CPU backend.
  virtual at::Tensor EmptyHost(at::IntArrayRef sizes, at::ScalarType dtype) = 0;
  // Makes [base, base + bytes) — host memory the caller keeps valid and never writes while
  // registered (a model file's mapping) — a source the device copies from asynchronously
  // without a staging copy, until the returned handle is released (before the memory goes
  // away). Any thread. CUDA: cudaHostRegister, read-only and portable (every GPU of the process);
  // FailedPrecondition naming the driver's reason when it refuses (the caller then copies into
  // EmptyHost memory). Unimplemented on the CPU backend: ordinary memory serves it as it is.
  virtual absl::StatusOr<std::shared_ptr<void>> RegisterHostMemory(void* base, int64_t bytes) {
    (void)base;
    (void)bytes;
    return absl::UnimplementedError("this backend copies from ordinary host memory; nothing to register");
  }
  // Called from inside a stream operation: copy host -> device / device -> host on that stream.
  // On CUDA the copy is asynchronous with respect to the host (ordered by the stream and its
  // events; the source must stay alive until the stream's next recorded event). On the CPU
  // backend both are deep copies, so a stage never aliases host-store memory.
  virtual at::Tensor Upload(const at::Tensor& host) = 0;
  virtual at::Tensor Download(const at::Tensor& on_device) = 0;
  // Chunked uploads (paper §4.2.2): allocate a stage-private device tensor, then fill byte
  // ranges of it with CopyToDevice(host bytes, device bytes) from stream operations, possibly
  // spread over several operations. Both arguments are 1-D kByte views of equal length.
  virtual at::Tensor EmptyOnDevice(at::IntArrayRef sizes, at::ScalarType dtype) = 0;
  virtual void CopyToDevice(const at::Tensor& host_bytes, const at::Tensor& device_bytes) = 0;
  // DeviceOptions::keep_weights_resident (benchmarks): weights go through Upload, which caches.
  virtual bool keeps_weights_resident() const { return false; }
  // The paced backend's clock (paced_device.h): stage compute then takes the profile's time
  // instead of running the math; null on the backends that compute.
  virtual const Pacer* pacer() const { return nullptr; }

  // Memory figures: device memory of the caching allocator of the worker's GPU (shared by the
  // workers that share one GPU; zeros on the CPU backend) and the pinned host arena (shared by
  // all CUDA workers of an engine).
  struct MemoryStats {
    int64_t device_in_use_bytes = 0;
    int64_t device_peak_bytes = 0;
    int64_t device_reserved_bytes = 0;
    int64_t device_total_bytes = 0;  // the card's memory
    int64_t pinned_reserved_bytes = 0;
    int64_t pinned_in_use_bytes = 0;
    int64_t pinned_peak_bytes = 0;
  };
  virtual MemoryStats Memory() const { return {}; }
  // For humans: "CPU worker (LibTorch CPU backend)", "NVIDIA H200 (GPU 0)".
  virtual std::string description() const = 0;
  virtual void ResetPeakMemory() {}

  void SynchronizeAll() {
    for (int k = 0; k < kNumStreamKinds; ++k) stream(static_cast<StreamKind>(k)).Synchronize();
  }

  // Bytes copied by Upload/Download since the device was created, by the stream that issued the
  // copy (activation up/down, parameter up, gradient down). Any thread may read them.
  int64_t TransferBytes(StreamKind kind) const {
    return transfer_bytes_[static_cast<int>(kind)].load(std::memory_order_relaxed);
  }

 protected:
  void CountTransfer(StreamKind kind, int64_t bytes) {
    transfer_bytes_[static_cast<int>(kind)].fetch_add(bytes, std::memory_order_relaxed);
  }

 private:
  std::array<std::atomic<int64_t>, kNumStreamKinds> transfer_bytes_{};
};

struct DeviceOptions {
  // Benchmark only (CUDA): upload each master tensor once and reuse the device copy, so an
  // iteration can be timed with weights kept resident (stale weights: never for training).
  bool keep_weights_resident = false;
  // Pinned host memory is obtained in slabs of this size (CUDA).
  int64_t pinned_slab_bytes = int64_t{256} << 20;
  // The clock of "paced:N" workers (required for them, ignored otherwise).
  std::shared_ptr<const Pacer> pacer;
};

// Device specs:
//   "cpu:N"          N CPU workers;
//   "cuda"           one worker per visible GPU;
//   "cuda:0,1,3"     one worker per listed GPU; a GPU listed k times gets k workers that share
//                    it (tests run N = 1..3 workers on one card this way);
//   "paced:N"        N paced workers (benchmarks of the schedule; needs DeviceOptions::pacer).
// Errors: InvalidArgument for a malformed spec, FailedPrecondition when the CUDA backend is
// asked for and no GPU (or not the listed one) is visible.
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(const std::string& spec, Timeline* timeline,
                                                                   const DeviceOptions& options = {});
// Number of GPUs CUDA sees (0 without a driver or device; never throws).
int VisibleCudaDevices();

}  // namespace rp::workers
