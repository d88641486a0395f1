// The paced backend's pieces: the Pacer's arithmetic and checks, and a paced device that moves
// no data but takes the time a copy would.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>

#include "workers/device/paced_device.h"
#include "workers/device/pacer.h"
#include "workers/store/host_model_store.h"

namespace rp::workers {
namespace {

PacerOptions ThreeLayers() {
  PacerOptions o;
  o.layers = {{0.0, 0.0, 0.0}, {0.010, 0.030, 0.035}, {0.020, 0.050, 0.060}};
  o.time_scale = 1;
  o.link_bytes_per_s = 1e9;
  return o;
}

TEST(Pacer, ComputeIsTheSumOfTheSlotsLayersAndABackwardSplitsAroundItsRecompute) {
  auto p = Pacer::Create(ThreeLayers());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ((*p)->ComputeSeconds(PacedCompute::kForward, 0, 3), 0.030);
  EXPECT_DOUBLE_EQ((*p)->ComputeSeconds(PacedCompute::kBackward, 1, 2), 0.080);
  EXPECT_DOUBLE_EQ((*p)->ComputeSeconds(PacedCompute::kFused, 2, 1), 0.060);
  EXPECT_DOUBLE_EQ((*p)->ComputeSeconds(PacedCompute::kRecompute, 1, 2) +
                       (*p)->ComputeSeconds(PacedCompute::kBackwardAfterRecompute, 1, 2),
                   0.080);
  EXPECT_DOUBLE_EQ((*p)->ComputeSeconds(PacedCompute::kForward, 2, 5), 0.020);  // clamped to the profile
}

TEST(Pacer, ACopyTakesItsBytesOverTheLinkAndSharesTheHostLimit) {
  PacerOptions o = ThreeLayers();
  o.host_bytes_per_s = 1.5e9;
  auto p = Pacer::Create(o);
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ((*p)->CopySeconds(1'000'000, 1), 1e-3);  // the link is the limit
  EXPECT_DOUBLE_EQ((*p)->CopySeconds(1'500'000, 3), 3e-3);  // three share 1.5 GB/s
  EXPECT_DOUBLE_EQ((*p)->OptimizerSeconds(1 << 20), 0);     // no rate: free
}

TEST(Pacer, BadOptionsAreRefusedNamingTheField) {
  PacerOptions o = ThreeLayers();
  o.time_scale = 0;
  EXPECT_NE(Pacer::Create(o).status().message().find("time_scale"), std::string::npos);
  o = ThreeLayers();
  o.layers[1].backward_s = -1;
  EXPECT_NE(Pacer::Create(o).status().message().find("layer 1"), std::string::npos);
  o = ThreeLayers();
  o.layers.clear();
  EXPECT_EQ(Pacer::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = ThreeLayers();
  o.link_bytes_per_s = 0;
  EXPECT_NE(Pacer::Create(o).status().message().find("link_bytes_per_s"), std::string::npos);
}

TEST(PacedDevice, CopiesTakeTheirTimeAndCarryNoData) {
  PacerOptions o = ThreeLayers();
  o.link_bytes_per_s = 1e8;  // 4 MB: 40 ms at scale 1, 20 ms at 0.5
  o.time_scale = 0.5;
  auto pacer = Pacer::Create(o);
  ASSERT_TRUE(pacer.ok());
  DeviceOptions dopt;
  dopt.pacer = std::shared_ptr<const Pacer>(std::move(*pacer));
  Timeline tl;
  auto devs = CreateDevices("paced:2", &tl, dopt);
  ASSERT_TRUE(devs.ok()) << devs.status();
  ASSERT_EQ(devs->size(), 2u);
  Device& d = *(*devs)[1];
  EXPECT_EQ(d.name(), "paced:1");
  EXPECT_NE(d.pacer(), nullptr);
  at::Tensor up;
  double took = 0;
  d.stream(StreamKind::kActivationUp).Enqueue({"in", 0, 0, 0}, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    up = d.Upload(at::zeros({1024, 1024}, at::kFloat));
    took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  d.SynchronizeAll();
  EXPECT_TRUE(up.is_meta());
  EXPECT_EQ(up.sizes(), at::IntArrayRef({1024, 1024}));
  EXPECT_GE(took, 0.020);
  EXPECT_EQ(d.TransferBytes(StreamKind::kActivationUp), 4 << 20);
  EXPECT_TRUE(d.EmptyOnDevice({3}, at::kBFloat16).is_meta());
}

TEST(PacedDevice, PacedWorkersNeedAProfile) {
  Timeline tl;
  auto devs = CreateDevices("paced:8", &tl);
  EXPECT_EQ(devs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(devs.status().message().find("profile"), std::string::npos) << devs.status();
  EXPECT_EQ(CreateDevices("paced:0", &tl).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DataFreeStore, HoldsShapesAndNoMemory) {
  spec::ModelConfig c;
  c.vocab = 151936;
  c.hidden = 4096;
  c.intermediate = 12288;
  c.num_blocks = 36;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;  // about 8 B parameters: 100 GB of fp32 copies, gradients and masters
  auto pacer = Pacer::Create(ThreeLayers());
  ASSERT_TRUE(pacer.ok());
  auto store = HostModelStore::DataFree(c, at::kBFloat16, std::shared_ptr<const Pacer>(std::move(*pacer)));
  ASSERT_NE(store->pacer(), nullptr);
  int64_t elements = 0;
  for (int i = 0; i < store->num_params(); ++i) {
    EXPECT_TRUE(store->param(i).master.is_meta());
    elements += store->param(i).master.numel();
  }
  EXPECT_GT(elements, int64_t{7'000'000'000});
  store->AccumulateGrad(0, at::empty({1}, at::TensorOptions().device(c10::kMeta)));  // accepted, no data
}

}  // namespace
}  // namespace rp::workers
