// The frozen-base record: CRCs cut into pieces equal one pass of zlib's crc32 over the bytes; the
// record round-trips through base.json and damage to it is found; a change to any frozen value,
// dtype or parameter set is named.
#include "workers/io/frozen_base.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include "workers/store/host_model_store.h"

namespace rp::workers::io {
namespace {

uint32_t OnePass(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), static_cast<const unsigned char*>(c.const_data_ptr()), c.nbytes()));
}

TEST(FrozenBase, PiecewiseCrcEqualsOnePassOverTheBytes) {
  // 40 MiB + 6 bytes: three 16 MiB pieces, the last one short and odd-sized.
  at::Tensor big = at::randint(0, 255, {(int64_t{40} << 20) + 6}, at::kByte);
  EXPECT_EQ(TensorCrc32(big), OnePass(big));
  at::Tensor small = at::randn({3, 5}, at::kFloat);
  EXPECT_EQ(TensorCrc32(small), OnePass(small));
  EXPECT_EQ(TensorCrc32(small.t()), OnePass(small.t().contiguous()));  // strided: row-major values
  EXPECT_NE(TensorCrc32(small.t()), TensorCrc32(small));
  EXPECT_EQ(TensorCrc32(at::empty({0}, at::kFloat)), 0u);
}

spec::ModelConfig LoraModel() {
  spec::ModelConfig c;
  c.family = "llama";
  c.vocab = 32;
  c.hidden = 16;
  c.intermediate = 24;
  c.num_blocks = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.lora.rank = 2;
  c.lora.targets = {"q_proj", "v_proj"};
  return c;
}

TEST(FrozenBase, DescribesTheFrozenParametersAndFindsEveryChange) {
  HostModelStore store(LoraModel(), at::kBFloat16, 3);
  const FrozenBase base = DescribeFrozenBase(store);
  int frozen = 0;
  int64_t bytes = 0;
  for (int i = 0; i < store.num_params(); ++i) {
    if (store.param(i).trainable) continue;
    const FrozenTensor& t = base.tensors.at(static_cast<size_t>(frozen++));
    EXPECT_EQ(t.name, store.param(i).name);
    EXPECT_EQ(t.dtype, "BF16");
    EXPECT_EQ(t.crc32, OnePass(store.param(i).master));
    bytes += static_cast<int64_t>(store.param(i).master.nbytes());
  }
  EXPECT_EQ(static_cast<int>(base.tensors.size()), frozen);
  EXPECT_GT(frozen, 10);
  EXPECT_EQ(base.bytes, bytes);
  EXPECT_EQ(base.fingerprint.size(), 8u);
  // base.json round-trips, and damage to it is found by the fingerprint over the entries.
  auto back = ParseFrozenBaseJson(FrozenBaseJson(base));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tensors, base.tensors);
  EXPECT_EQ(back->bytes, base.bytes);
  EXPECT_TRUE(SameFrozenBase(base, *back, "x").ok());
  std::string json = FrozenBaseJson(base);
  const std::string crc = std::to_string(base.tensors[3].crc32);
  json.replace(json.find(crc), crc.size(), std::to_string(base.tensors[3].crc32 ^ 1));
  EXPECT_EQ(ParseFrozenBaseJson(json).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseFrozenBaseJson("{\"tensors\": 3}").status().code(), absl::StatusCode::kDataLoss);
  // The same seed is the same base; one changed frozen value is named.
  HostModelStore same(LoraModel(), at::kBFloat16, 3);
  EXPECT_TRUE(SameFrozenBase(base, DescribeFrozenBase(same), "checkpoint c").ok());
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  at::Tensor v = same.param(same.FindParam(name)).master.to(at::kFloat);
  v[0][0] += 1;
  ASSERT_TRUE(same.SetValue(name, v).ok());
  absl::Status st = SameFrozenBase(base, DescribeFrozenBase(same), "checkpoint c");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("checkpoint c: base tensor " + name + " has other values"), std::string::npos) << st;
  // Another master dtype, and a base with a parameter more or less.
  HostModelStore half(LoraModel(), at::kHalf, 3);
  st = SameFrozenBase(base, DescribeFrozenBase(half), "c");
  EXPECT_NE(st.message().find("was BF16, this job's is F16"), std::string::npos) << st;
  spec::ModelConfig wider = LoraModel();
  wider.lora.targets = {"q_proj"};  // v_proj stays frozen: this job freezes more
  HostModelStore more(wider, at::kBFloat16, 3);
  FrozenBase m = DescribeFrozenBase(more);
  st = SameFrozenBase(base, m, "c");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(SameFrozenBase(m, base, "c").ok());
  // Nothing frozen: an empty record (full fine-tuning).
  spec::ModelConfig full = LoraModel();
  full.lora.rank = 0;
  EXPECT_TRUE(DescribeFrozenBase(HostModelStore(full, at::kFloat, 3)).empty());
}

}  // namespace
}  // namespace rp::workers::io
