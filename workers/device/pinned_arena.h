// pinned_arena.h — page-locked host memory for asynchronous host<->GPU copies (paper §4.2):
// master weights, downloaded activations and gradients. Unlike PyTorch's caching host
// allocator, a request is not rounded up to a power of two: blocks are carved best-fit out of
// large slabs (rounded to 512 bytes only) and freed blocks coalesce with their neighbours, so a
// 3.4 GB set of bf16 masters costs 3.4 GB of pinned memory, not up to twice that.
//
// Contract: thread-safe (one mutex). Empty() hands out CPU tensors whose storage deleter gives
// the block back; each tensor keeps the arena alive (shared ownership), so the arena may be
// dropped by its creator while tensors live on. A block is reused as soon as its tensor dies:
// whoever issues an asynchronous copy from/to it must keep the tensor alive until the copy has
// completed (CudaDevice does). Slabs are never returned to the system before the arena dies.
// The slab source is injectable so the allocation logic is tested without a GPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/base/mutex.h"

namespace rp::workers {

struct SlabSource {
  std::function<void*(size_t)> alloc;  // returns nullptr on failure
  std::function<void(void*)> release;
  const char* what = "pinned";  // for error messages
};
// cudaHostAlloc(portable) / cudaFreeHost.
SlabSource CudaPinnedSlabs();

class PinnedArena : public std::enable_shared_from_this<PinnedArena> {
 public:
  static constexpr int64_t kAlignment = 512;
  static std::shared_ptr<PinnedArena> Create(SlabSource source, int64_t slab_bytes = int64_t{256} << 20);
  ~PinnedArena();
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  // A contiguous CPU tensor in pinned memory; ResourceExhausted when no slab can be obtained.
  absl::StatusOr<at::Tensor> Empty(at::IntArrayRef sizes, at::ScalarType dtype);

  struct Stats {
    int64_t reserved_bytes = 0;  // slabs obtained from the system
    int64_t in_use_bytes = 0;    // blocks handed out (after 512-byte rounding)
    int64_t peak_in_use_bytes = 0;
    int64_t requested_bytes = 0;  // sum of live tensors' sizes before rounding
    int slabs = 0;
    int free_blocks = 0;
  };
  Stats stats() const;

 private:
  PinnedArena(SlabSource source, int64_t slab_bytes) : source_(std::move(source)), slab_bytes_(slab_bytes) {}
  struct FreeBlock {
    int64_t size = 0;
    int slab = 0;
  };
  char* Allocate(int64_t bytes, int64_t requested);  // nullptr on failure
  void Release(char* p);
  void InsertFree(char* p, int64_t size, int slab) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseFree(std::map<char*, FreeBlock>::iterator f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SlabSource source_;
  const int64_t slab_bytes_;
  mutable base::Mutex mu_;
  std::vector<std::pair<char*, int64_t>> slabs_ ABSL_GUARDED_BY(mu_);
  std::map<char*, FreeBlock> free_by_addr_ ABSL_GUARDED_BY(mu_);
  std::multimap<int64_t, char*> free_by_size_ ABSL_GUARDED_BY(mu_);
  struct UsedBlock {
    int64_t size = 0, requested = 0;
    int slab = 0;
  };
  std::map<char*, UsedBlock> used_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rp::workers
