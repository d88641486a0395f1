#include "workers/device/pinned_arena.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "workers/base/check.h"

namespace rp::workers {

SlabSource CudaPinnedSlabs() {
  SlabSource s;
  s.alloc = [](size_t bytes) -> void* {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls are unaffected
      return nullptr;
    }
    return p;
  };
  s.release = [](void* p) { (void)cudaFreeHost(p); };
  s.what = "pinned (cudaHostAlloc)";
  return s;
}

std::shared_ptr<PinnedArena> PinnedArena::Create(SlabSource source, int64_t slab_bytes) {
  return std::shared_ptr<PinnedArena>(new PinnedArena(std::move(source), std::max<int64_t>(slab_bytes, kAlignment)));
}

PinnedArena::~PinnedArena() {
  for (auto& [p, n] : slabs_) source_.release(p);
}

void PinnedArena::InsertFree(char* p, int64_t size, int slab) {
  free_by_addr_[p] = {size, slab};
  free_by_size_.emplace(size, p);
}

void PinnedArena::EraseFree(std::map<char*, FreeBlock>::iterator f) {
  auto range = free_by_size_.equal_range(f->second.size);
  for (auto s = range.first; s != range.second; ++s) {
    if (s->second == f->first) {
      free_by_size_.erase(s);
      break;
    }
  }
  free_by_addr_.erase(f);
}

char* PinnedArena::Allocate(int64_t bytes, int64_t requested) {
  base::MutexLock lock(&mu_);
  auto it = free_by_size_.lower_bound(bytes);  // best fit: the smallest block that is large enough
  if (it == free_by_size_.end()) {
    const int64_t slab = std::max(slab_bytes_, bytes);
    char* p = static_cast<char*>(source_.alloc(static_cast<size_t>(slab)));
    if (p == nullptr) return nullptr;
    slabs_.emplace_back(p, slab);
    stats_.reserved_bytes += slab;
    stats_.slabs = static_cast<int>(slabs_.size());
    InsertFree(p, slab, static_cast<int>(slabs_.size()) - 1);
    it = free_by_size_.lower_bound(bytes);
  }
  char* p = it->second;
  const FreeBlock fb = free_by_addr_.at(p);
  free_by_size_.erase(it);
  free_by_addr_.erase(p);
  if (fb.size > bytes) InsertFree(p + bytes, fb.size - bytes, fb.slab);
  used_[p] = {bytes, requested, fb.slab};
  stats_.in_use_bytes += bytes;
  stats_.requested_bytes += requested;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  stats_.free_blocks = static_cast<int>(free_by_addr_.size());
  return p;
}

void PinnedArena::Release(char* p) {
  base::MutexLock lock(&mu_);
  auto u = used_.find(p);
  RP_CHECK(u != used_.end()) << "pinned arena: freeing " << static_cast<void*>(p) << ", which it never handed out";
  int64_t size = u->second.size;
  const int slab = u->second.slab;
  stats_.in_use_bytes -= size;
  stats_.requested_bytes -= u->second.requested;
  used_.erase(u);
  // Coalesce with the following and the preceding free block of the same slab.
  if (auto next = free_by_addr_.find(p + size); next != free_by_addr_.end() && next->second.slab == slab) {
    size += next->second.size;
    EraseFree(next);
  }
  auto prev = free_by_addr_.lower_bound(p);
  if (prev != free_by_addr_.begin()) {
    --prev;
    if (prev->first + prev->second.size == p && prev->second.slab == slab) {
      p = prev->first;
      size += prev->second.size;
      EraseFree(prev);
    }
  }
  InsertFree(p, size, slab);
  stats_.free_blocks = static_cast<int>(free_by_addr_.size());
}

absl::StatusOr<at::Tensor> PinnedArena::Empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  const int64_t numel = std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>());
  const int64_t requested = numel * static_cast<int64_t>(c10::elementSize(dtype));
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  if (requested == 0) return at::empty(sizes, options);
  const int64_t bytes = (requested + kAlignment - 1) / kAlignment * kAlignment;
  char* p = Allocate(bytes, requested);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot obtain ", std::max(slab_bytes_, bytes), " bytes of ", source_.what, " host memory (",
        stats().reserved_bytes,
        " bytes already reserved): the host is out of page-lockable memory; use a smaller model or fewer jobs"));
  }
  std::shared_ptr<PinnedArena> self = shared_from_this();
  return at::from_blob(
      p, sizes, [self](void* q) { self->Release(static_cast<char*>(q)); }, options);
}

PinnedArena::Stats PinnedArena::stats() const {
  base::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace rp::workers
