// A LoRA base used where it lies in the model file, registered for DMA (io/hf_config.h
// LoadHfWeights with a MappingRegistrar; the CUDA backend's registrar is cudaHostRegister, run by
// tests/gpu). Here the registrar is a recorder on the CPU backend: each file is registered once,
// as a whole; the registered masters stay where they lie through RelocateMasters; the registration
// is released before the file is unmapped; a refused registration leaves masters to be copied.
#include <sys/mman.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/bf16_model_dir.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tiny_models.h"
#include "workers/io/hf_config.h"
#include "workers/io/hf_tensors.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {
namespace {

spec::ModelConfig TinyLora() {
  spec::ModelConfig c = rp::testing::TinyLlama();
  c.lora.rank = 2;
  c.lora.alpha = 4;
  c.lora.targets = {"q_proj", "v_proj"};
  return c;
}

// Records registrations; a handle's release checks that its range is still mapped (msync fails
// with ENOMEM on an unmapped range).
struct Recorder {
  bool refuse = false;
  int calls = 0;
  std::vector<std::pair<void*, int64_t>> ranges;
  std::shared_ptr<std::atomic<int>> live = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> released_unmapped = std::make_shared<std::atomic<int>>(0);
  MappingRegistrar Fn() {
    return [this](void* base, int64_t bytes) -> absl::StatusOr<std::shared_ptr<void>> {
      ++calls;
      ranges.emplace_back(base, bytes);
      if (refuse) return absl::FailedPreconditionError("refused by the test");
      ++*live;
      return std::shared_ptr<void>(base, [live = live, gone = released_unmapped, bytes](void* p) {
        if (msync(p, static_cast<size_t>(bytes), MS_ASYNC) != 0) ++*gone;
        --*live;
      });
    };
  }
};

bool Inside(const at::Tensor& t, const std::pair<void*, int64_t>& range) {
  const auto* p = static_cast<const char*>(t.data_ptr());
  const auto* b = static_cast<const char*>(range.first);
  return p >= b && p + t.nbytes() <= b + range.second;
}

// Every frozen master equals the file's tensor.
void ExpectMastersEqualTheFile(const HostModelStore& store, const std::string& dir) {
  for (int i = 0; i < store.num_params(); ++i) {
    const HostParam& p = store.param(i);
    if (p.trainable) continue;
    auto want = ReadHfTensor(dir, p.name, p.shape);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(at::equal(p.master, want->to(at::kBFloat16))) << p.name;
  }
}

TEST(MappedBase, EachFileIsRegisteredOnceAndReleasedBeforeItIsUnmapped) {
  const std::string dir = (rp::testing::FreshTempDir("MappedBase", "registered") / "model").string();
  rp::testing::WriteBf16ModelDir(dir, TinyLora());
  Recorder rec;
  auto store = std::make_unique<HostModelStore>(TinyLora(), at::kBFloat16, 1, 0.02, FrozenInit::kDeferred);
  ASSERT_TRUE(LoadHfWeights(dir, store.get(), rec.Fn()).ok());
  ASSERT_EQ(rec.calls, 1);
  EXPECT_EQ(rec.ranges[0].second, static_cast<int64_t>(std::filesystem::file_size(dir + "/model.safetensors")));
  std::vector<const void*> before;
  int frozen = 0;
  for (int i = 0; i < store->num_params(); ++i) {
    const HostParam& p = store->param(i);
    before.push_back(p.master.data_ptr());
    if (p.trainable) continue;
    ++frozen;
    EXPECT_TRUE(p.mapped && p.registered) << p.name;
    EXPECT_TRUE(Inside(p.master, rec.ranges[0])) << p.name;
  }
  ASSERT_GT(frozen, 0);
  EXPECT_EQ(store->RegisteredBytes(), store->MappedBytes());
  EXPECT_GT(store->MappedBytes(), 0);
  // RelocateMasters (the CUDA backend's pinned copy) moves only what is not registered.
  int copies = 0;
  store->RelocateMasters([&copies](at::IntArrayRef sizes, at::ScalarType dtype) {
    ++copies;
    return at::empty(sizes, dtype);
  });
  EXPECT_EQ(copies, store->num_params() - frozen);
  for (int i = 0; i < store->num_params(); ++i) {
    EXPECT_EQ(store->param(i).master.data_ptr() == before[static_cast<size_t>(i)], !store->param(i).trainable)
        << store->param(i).name;
  }
  ExpectMastersEqualTheFile(*store, dir);
  EXPECT_EQ(rec.live->load(), 1);
  store.reset();
  EXPECT_EQ(rec.live->load(), 0);
  EXPECT_EQ(rec.released_unmapped->load(), 0) << "the file was unmapped while still registered";
}

TEST(MappedBase, ARefusedRegistrationLeavesTheMappedMastersToBeCopied) {
  const std::string dir = (rp::testing::FreshTempDir("MappedBase", "refused") / "model").string();
  rp::testing::WriteBf16ModelDir(dir, TinyLora());
  Recorder rec;
  rec.refuse = true;
  HostModelStore store(TinyLora(), at::kBFloat16, 1, 0.02, FrozenInit::kDeferred);
  ASSERT_TRUE(LoadHfWeights(dir, &store, rec.Fn()).ok());
  EXPECT_EQ(rec.calls, 1) << "a refusal is remembered: not asked again per tensor";
  EXPECT_EQ(store.RegisteredBytes(), 0);
  EXPECT_GT(store.MappedBytes(), 0);
  store.RelocateMasters([](at::IntArrayRef sizes, at::ScalarType dtype) { return at::empty(sizes, dtype); });
  EXPECT_EQ(store.MappedBytes(), 0);
  ExpectMastersEqualTheFile(store, dir);
  // Without a registrar (the CPU backend) nothing is registered either.
  HostModelStore plain(TinyLora(), at::kBFloat16, 1, 0.02, FrozenInit::kDeferred);
  ASSERT_TRUE(LoadHfWeights(dir, &plain).ok());
  EXPECT_EQ(plain.RegisteredBytes(), 0);
  EXPECT_GT(plain.MappedBytes(), 0);
}

}  // namespace
}  // namespace rp::workers::io
