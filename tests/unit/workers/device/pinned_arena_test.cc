// The pinned arena's allocation logic, with an ordinary-memory slab source (no GPU needed; the
// CUDA slab source is exercised by tests/gpu).
#include "workers/device/pinned_arena.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "workers/device/device.h"

namespace rp::workers {
namespace {

struct CountingSlabs {
  int allocs = 0, releases = 0;
  int64_t fail_above = INT64_MAX;
  SlabSource Source() {
    SlabSource s;
    s.alloc = [this](size_t n) -> void* {
      if (static_cast<int64_t>(n) > fail_above) return nullptr;
      ++allocs;
      return std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    };
    s.release = [this](void* p) {
      ++releases;
      std::free(p);
    };
    s.what = "test";
    return s;
  }
};

TEST(PinnedArena, NoPowerOfTwoRoundingAndBlocksCoalesce) {
  CountingSlabs slabs;
  auto arena = PinnedArena::Create(slabs.Source(), /*slab_bytes=*/1 << 20);
  // 300 KB + 1 element: a power-of-two allocator would take 512 KiB; we take 300 KB rounded to 512.
  auto a = arena->Empty({75001}, at::kFloat);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(arena->stats().in_use_bytes, (300004 + 511) / 512 * 512);
  EXPECT_EQ(arena->stats().requested_bytes, 300004);
  auto b = arena->Empty({100, 1000}, at::kBFloat16);  // 200 000 bytes, same slab
  auto c = arena->Empty({1000}, at::kByte);
  ASSERT_TRUE(b.ok() && c.ok());
  EXPECT_EQ(slabs.allocs, 1);
  // Values survive, and the three blocks do not overlap.
  a->fill_(1.5f);
  b->fill_(-2.0f);
  c->fill_(7);
  EXPECT_EQ(a->sum().item<double>(), 1.5 * 75001);
  EXPECT_EQ(b->to(at::kFloat).sum().item<double>(), -2.0 * 100000);
  EXPECT_EQ(c->to(at::kInt).sum().item<int>(), 7000);
  // Free the middle one, then the others: everything coalesces back into one free block.
  *b = at::Tensor();
  EXPECT_EQ(arena->stats().free_blocks, 2);  // the hole and the slab's tail
  *a = at::Tensor();
  *c = at::Tensor();
  const auto st = arena->stats();
  EXPECT_EQ(st.in_use_bytes, 0);
  EXPECT_EQ(st.free_blocks, 1);
  EXPECT_EQ(st.reserved_bytes, 1 << 20);
  EXPECT_GE(st.peak_in_use_bytes, 300032 + 200192 + 1024);
  // The whole slab is reusable as one block now.
  auto whole = arena->Empty({1 << 20}, at::kByte);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(slabs.allocs, 1);
}

TEST(PinnedArena, GrowsBySlabsKeepsItselfAliveAndReportsExhaustion) {
  CountingSlabs slabs;
  slabs.fail_above = 8 << 20;
  at::Tensor survivor;
  {
    auto arena = PinnedArena::Create(slabs.Source(), /*slab_bytes=*/1 << 20);
    auto big = arena->Empty({3 << 20}, at::kByte);  // larger than a slab: its own slab
    ASSERT_TRUE(big.ok());
    auto small = arena->Empty({10}, at::kFloat);
    ASSERT_TRUE(small.ok());
    EXPECT_EQ(slabs.allocs, 2);
    EXPECT_EQ(arena->stats().reserved_bytes, (3 << 20) + (1 << 20));
    auto too_big = arena->Empty({16 << 20}, at::kByte);
    ASSERT_FALSE(too_big.ok());
    EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(too_big.status().message().find("test host memory"), std::string::npos) << too_big.status();
    auto empty = arena->Empty({0, 4}, at::kFloat);
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(empty->numel(), 0);
    survivor = *small;
    survivor.fill_(3);
  }
  // The creator's handle is gone; the tensor still holds the arena (and its slabs).
  EXPECT_EQ(slabs.releases, 0);
  EXPECT_EQ(survivor.sum().item<float>(), 30.0f);
  survivor = at::Tensor();
  EXPECT_EQ(slabs.releases, 2);
}

TEST(DeviceSpecs, MalformedSpecsAndMissingGpusGetClearErrors) {
  Timeline tl;
  EXPECT_EQ(CreateDevices("gpu:2", &tl).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateDevices("cpu:0", &tl).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateDevices("cuda:0,x", &tl).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateDevices("cuda:-1", &tl).status().code(), absl::StatusCode::kInvalidArgument);
  auto far = CreateDevices("cuda:999", &tl);
  EXPECT_EQ(far.status().code(), absl::StatusCode::kFailedPrecondition) << far.status();
  if (VisibleCudaDevices() == 0) {
    auto st = CreateDevices("cuda", &tl).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(st.message().find("no CUDA GPU is visible"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace rp::workers
