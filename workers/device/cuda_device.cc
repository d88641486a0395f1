#include "workers/device/cuda_device.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "workers/base/check.h"

namespace rp::workers {
namespace {

thread_local CudaStream* current_stream = nullptr;

void CheckCuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

// Index 0 of the allocator's StatArray is the aggregate over pool kinds (StatType::AGGREGATE;
// the enum's namespace moved between LibTorch releases, the layout did not).
constexpr size_t kAggregate = 0;

}  // namespace

CudaStream* CudaStream::Current() { return current_stream; }

void CudaStream::MarkTransferStart() {
  if (started_) return;
  started_ = true;
  if (timeline_ != nullptr) host_start_ = timeline_->Now();
  if (start_ != nullptr) (void)cudaEventRecord(start_, stream_.stream());
}

CudaStream::CudaStream(CudaDevice* device, StreamKind kind, c10::cuda::CUDAStream stream, Timeline* timeline)
    : device_(device), kind_(kind), stream_(stream), timeline_(timeline) {
  Start(&device->health());
}

CudaStream::~CudaStream() { Stop(); }

void CudaStream::ThreadBegin() {
  current_stream = this;
  device_guard_.emplace(static_cast<c10::DeviceIndex>(device_->gpu()));
  stream_guard_.emplace(stream_);
  if (cudaEventCreate(&start_) != cudaSuccess || cudaEventCreate(&end_) != cudaSuccess) {
    std::fprintf(stderr, "roundpipe: %s stream of %s: cannot create CUDA events: %s\n", StreamKindName(kind_),
                 device_->name().c_str(), cudaGetErrorString(cudaGetLastError()));
    start_ = end_ = nullptr;  // completion then falls back to stream synchronisation
  }
}

void CudaStream::ThreadEnd() {
  if (start_ != nullptr) (void)cudaEventDestroy(start_);
  if (end_ != nullptr) (void)cudaEventDestroy(end_);
  stream_guard_.reset();
  device_guard_.reset();
  current_stream = nullptr;
}

void CudaStream::RunOp(Op& op) {
  const bool timed = timeline_ != nullptr && !op.info.label.empty();
  // The busy interval starts with the operation's first device work: at once for compute; for
  // a copy stream at its first transfer (MarkTransferStart), so time spent waiting on the host
  // (an input upload blocking until another worker produced the activation) is not "busy".
  started_ = false;
  host_start_ = timed ? timeline_->Now() : 0;
  if (kind_ == StreamKind::kCompute) MarkTransferStart();
  try {
    op.fn();  // operations report their own errors (device.h); this is the safety net
  } catch (const std::exception& e) {
    std::fprintf(stderr, "roundpipe: uncaught exception on %s stream of %s: %s\n", StreamKindName(kind_),
                 device_->name().c_str(), e.what());
  }
  // Completion: the next operation (and any host Event recorded after this one) starts only
  // when the GPU has finished this one's work.
  MarkTransferStart();  // no-op if the operation already did device work
  cudaError_t err = end_ != nullptr ? cudaEventRecord(end_, stream_.stream()) : cudaErrorInvalidValue;
  err = err == cudaSuccess ? cudaEventSynchronize(end_) : cudaStreamSynchronize(stream_.stream());
  if (err != cudaSuccess) {
    // A sticky error (e.g. an illegal address) also fails the next operation's first CUDA
    // call, which the DeviceWorker turns into the iteration's error.
    std::fprintf(stderr, "roundpipe: CUDA error on %s stream of %s after '%s': %s\n", StreamKindName(kind_),
                 device_->name().c_str(), op.info.label.c_str(), cudaGetErrorString(err));
  }
  keep_alive_.clear();
  if (timed) {
    const double host_end = timeline_->Now();
    float ms = 0;
    double start_s = host_start_;
    if (start_ != nullptr && err == cudaSuccess && cudaEventElapsedTime(&ms, start_, end_) == cudaSuccess) {
      start_s = std::max(host_start_, host_end - ms / 1e3);  // GPU-measured duration
    }
    timeline_->Add({device_->index(), StreamKindName(kind_), std::move(op.info.label), op.info.iteration, op.info.slot,
                    op.info.microbatch, start_s, host_end, op.info.job});
  }
}

CudaDevice::CudaDevice(int index, int gpu, std::string name, std::shared_ptr<PinnedArena> arena,
                       const DeviceOptions& options, Timeline* timeline)
    : index_(index),
      gpu_(gpu),
      name_(std::move(name)),
      arena_(std::move(arena)),
      options_(options),
      timeline_(timeline) {
  const auto dev = static_cast<c10::DeviceIndex>(gpu);
  // Initialise CUDA and the caching allocator for this GPU now (a tiny allocation), so Memory()
  // and the stream pool work before the first stage runs.
  (void)at::empty({1}, at::TensorOptions().device(c10::Device(c10::kCUDA, dev)));
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, gpu) == cudaSuccess) {
    description_ = absl::StrCat(prop.name, " (GPU ", gpu, ")");
    total_bytes_ = static_cast<int64_t>(prop.totalGlobalMem);
  } else {
    description_ = absl::StrCat("CUDA GPU ", gpu);
  }
  for (int k = 0; k < kNumStreamKinds; ++k) streams_[k] = MakeStream(static_cast<StreamKind>(k));
}

std::unique_ptr<CudaStream> CudaDevice::MakeStream(StreamKind kind) {
  // Activation transfers gate compute (paper §4.2.2): their streams get the high priority.
  const bool high = kind == StreamKind::kActivationUp || kind == StreamKind::kActivationDown;
  return std::make_unique<CudaStream>(
      this, kind, c10::cuda::getStreamFromPool(high, static_cast<c10::DeviceIndex>(gpu_)), timeline_);
}

std::unique_ptr<Stream> CudaDevice::NewStream(StreamKind kind) { return MakeStream(kind); }

CudaDevice::~CudaDevice() {
  for (auto& s : streams_) s.reset();  // drains and joins before the arena reference goes
}

c10::Device CudaDevice::torch_device() const { return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(gpu_)); }

at::Tensor CudaDevice::EmptyHost(at::IntArrayRef sizes, at::ScalarType dtype) {
  auto t = arena_->Empty(sizes, dtype);
  if (!t.ok()) throw std::runtime_error(std::string(t.status().message()));
  return *std::move(t);
}

absl::StatusOr<std::shared_ptr<void>> CudaDevice::RegisterHostMemory(void* base, int64_t bytes) {
  if (base == nullptr || bytes <= 0) return absl::InvalidArgumentError("RegisterHostMemory: an empty range");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(gpu_));
  // Read-only registration only: pinning a private file mapping for writing would copy every page
  // into anonymous memory (copy-on-write), the very copy this avoids.
  int read_only = 0;
  if (cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, gpu_) != cudaSuccess ||
      read_only == 0) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat(name_, ": this GPU or driver cannot register read-only host memory"));
  }
  // Whole pages: the mapping starts on one, and its last page is mapped in full.
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(bytes) + page - 1) & ~(page - 1);
  void* start = reinterpret_cast<void*>(begin);
  const cudaError_t err = cudaHostRegister(start, end - begin, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so later calls do not report it
    return absl::FailedPreconditionError(
        absl::StrCat(name_, ": cudaHostRegister of ", end - begin, " bytes: ", cudaGetErrorString(err)));
  }
  return std::shared_ptr<void>(start, [](void* p) { (void)cudaHostUnregister(p); });
}

at::Tensor CudaDevice::Upload(const at::Tensor& host) {
  CudaStream* cs = CudaStream::Current();
  RP_CHECK(cs != nullptr) << "CudaDevice::Upload called outside a stream operation";
  cs->MarkTransferStart();
  const StreamKind kind = cs->kind();
  at::Tensor src = host.is_contiguous() ? host : host.contiguous();
  if (options_.keep_weights_resident && kind == StreamKind::kParamUp) {
    base::MutexLock lock(&resident_mu_);
    auto it = resident_.find(src.data_ptr());
    if (it == resident_.end()) {
      it = resident_.emplace(src.data_ptr(), src.to(torch_device(), /*non_blocking=*/false, /*copy=*/true)).first;
    }
    return it->second.detach();  // a fresh leaf per stage: its .grad is the stage's own
  }
  at::Tensor dst = EmptyOnDevice(src.sizes(), src.scalar_type());
  dst.copy_(src, /*non_blocking=*/true);
  cs->KeepAlive(src);
  CountTransfer(kind, static_cast<int64_t>(src.nbytes()));
  return dst;
}

at::Tensor CudaDevice::EmptyOnDevice(at::IntArrayRef sizes, at::ScalarType dtype) {
  CudaStream* cs = CudaStream::Current();
  RP_CHECK(cs != nullptr) << "CudaDevice::EmptyOnDevice called outside a stream operation";
  cs->MarkTransferStart();
  at::Tensor dst = at::empty(sizes, at::TensorOptions().dtype(dtype).device(torch_device()));
  if (cs->kind() != StreamKind::kCompute) {
    // Allocated on a copy stream, used and freed by compute: tell the caching allocator, so the
    // block is not handed out again before the compute stream is done with it.
    c10::cuda::CUDACachingAllocator::recordStream(dst.storage().data_ptr(),
                                                  streams_[static_cast<int>(StreamKind::kCompute)]->cuda());
  }
  return dst;
}

void CudaDevice::CopyToDevice(const at::Tensor& host_bytes, const at::Tensor& device_bytes) {
  CudaStream* cs = CudaStream::Current();
  RP_CHECK(cs != nullptr) << "CudaDevice::CopyToDevice called outside a stream operation";
  cs->MarkTransferStart();
  device_bytes.copy_(host_bytes, /*non_blocking=*/true);
  cs->KeepAlive(host_bytes);
  CountTransfer(cs->kind(), host_bytes.numel());
}

at::Tensor CudaDevice::Download(const at::Tensor& on_device) {
  CudaStream* cs = CudaStream::Current();
  RP_CHECK(cs != nullptr) << "CudaDevice::Download called outside a stream operation";
  cs->MarkTransferStart();
  at::Tensor src = on_device.is_contiguous() ? on_device : on_device.contiguous();
  at::Tensor host = EmptyHost(src.sizes(), src.scalar_type());
  host.copy_(src, /*non_blocking=*/true);
  // The caller hands the result to host consumers at once: wait for this copy only.
  CheckCuda(cudaStreamSynchronize(cs->cuda().stream()), "device-to-host copy");
  CountTransfer(cs->kind(), static_cast<int64_t>(src.nbytes()));
  return host;
}

Device::MemoryStats CudaDevice::Memory() const {
  MemoryStats m;
  const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(gpu_));
  m.device_in_use_bytes = s.allocated_bytes[kAggregate].current;
  m.device_peak_bytes = s.allocated_bytes[kAggregate].peak;
  m.device_reserved_bytes = s.reserved_bytes[kAggregate].current;
  m.device_total_bytes = total_bytes_;
  const PinnedArena::Stats p = arena_->stats();
  m.pinned_reserved_bytes = p.reserved_bytes;
  m.pinned_in_use_bytes = p.in_use_bytes;
  m.pinned_peak_bytes = p.peak_in_use_bytes;
  return m;
}

void CudaDevice::ResetPeakMemory() {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(gpu_));
}

}  // namespace rp::workers
