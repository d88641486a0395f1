// GPU tests (ctest label "gpu"): the CUDA backend against the CPU backend. Without a visible GPU
// every test skips with a visible "[  SKIPPED ]" (ctest reports them as skipped, not passed).
// tests/gpu/run.sh runs them on the lent device machine.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>

#include <cctype>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "scheduler/engine.h"
#include "scheduler/runtime/engine_impl.h"
#include "tests/support/bf16_model_dir.h"
#include "tests/support/engine_values.h"
#include "tests/support/reference_model.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tiny_models.h"
#include "tests/support/tokens.h"
#include "workers/device/cuda_device.h"
#include "workers/device/device.h"
#include "workers/io/hf_config.h"
#include "workers/store/host_model_store.h"

namespace rp {
namespace {

using namespace std::chrono_literals;
using scheduler::Engine;
using scheduler::JobEvent;
using scheduler::JobSpec;
using scheduler::JobState;
using workers::StreamKind;

#define RP_REQUIRE_GPU()                                                           \
  do {                                                                             \
    if (workers::VisibleCudaDevices() == 0) GTEST_SKIP() << "no CUDA GPU visible"; \
  } while (0)

// ---- the device itself -------------------------------------------------------------------

TEST(CudaDevice, UploadDownloadRoundTripIsExactPinnedAndCounted) {
  RP_REQUIRE_GPU();
  workers::Timeline tl;
  auto devs = workers::CreateDevices("cuda:0", &tl);
  ASSERT_TRUE(devs.ok()) << devs.status();
  workers::Device& d = *(*devs)[0];
  EXPECT_EQ(d.name(), "cuda:0");
  EXPECT_TRUE(d.torch_device().is_cuda());
  const at::Tensor f32 = at::randn({37, 129}).t();  // non-contiguous source
  const at::Tensor b16 = at::randn({1000}).to(at::kBFloat16);
  const at::Tensor ids = at::randint(50000, {4, 33}, at::TensorOptions().dtype(at::kLong));
  std::vector<at::Tensor> back(3);
  std::vector<at::Tensor> on_dev(3);
  d.stream(StreamKind::kActivationUp).Enqueue({"up", 0, 0, 0}, [&] {
    on_dev[0] = d.Upload(f32);
    on_dev[1] = d.Upload(b16);
    on_dev[2] = d.Upload(ids);
  });
  auto up = workers::MakeEvent();
  d.stream(StreamKind::kActivationUp).RecordEvent(up);
  d.stream(StreamKind::kActivationDown).WaitEvent(up);
  d.stream(StreamKind::kActivationDown).Enqueue({"down", 0, 0, 0}, [&] {
    for (int i = 0; i < 3; ++i) back[i] = d.Download(on_dev[i] * 1);  // a fresh device tensor
  });
  d.SynchronizeAll();
  EXPECT_TRUE(on_dev[0].is_cuda());
  EXPECT_TRUE(at::equal(back[0], f32));
  EXPECT_TRUE(at::equal(back[1], b16));
  EXPECT_TRUE(at::equal(back[2], ids));
  for (const auto& t : back) EXPECT_TRUE(t.is_pinned());
  const int64_t bytes = static_cast<int64_t>(f32.nbytes() + b16.nbytes() + ids.nbytes());
  EXPECT_EQ(d.TransferBytes(StreamKind::kActivationUp), bytes);
  EXPECT_EQ(d.TransferBytes(StreamKind::kActivationDown), bytes);
  const auto mem = d.Memory();
  EXPECT_GT(mem.device_peak_bytes, 0);
  EXPECT_GT(mem.pinned_reserved_bytes, 0);
}

// A LoRA base used from its model file: the CUDA backend registers the file's mapping for DMA
// (read-only, once per file), the masters stay in the file's pages, an upload from them on a
// stream is exact, and the registration ends with the store. Where the driver refuses, the
// reason is printed and the masters are copied into the pinned arena instead (the fallback).
TEST(CudaDevice, AMappedModelFileIsRegisteredForDmaOrCopiedAndUploadsExactly) {
  RP_REQUIRE_GPU();
  spec::ModelConfig c = rp::testing::TinyLlama();
  c.lora.rank = 4;
  c.lora.targets = {"q_proj", "v_proj"};
  const std::string dir = (rp::testing::FreshTempDir("CudaDevice", "mapped") / "model").string();
  rp::testing::WriteBf16ModelDir(dir, c);
  workers::Timeline tl;
  auto devs = workers::CreateDevices("cuda:0", &tl);
  ASSERT_TRUE(devs.ok()) << devs.status();
  workers::Device& d = *(*devs)[0];
  auto direct = d.RegisterHostMemory(nullptr, 0);
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kInvalidArgument);
  workers::HostModelStore store(c, at::kBFloat16, 1, 0.02, workers::FrozenInit::kDeferred);
  std::string refused;
  ASSERT_TRUE(workers::io::LoadHfWeights(dir, &store, [&](void* base, int64_t bytes) {
                auto h = d.RegisterHostMemory(base, bytes);
                if (!h.ok()) refused = std::string(h.status().message());
                return h;
              }).ok());
  if (!refused.empty()) {
    std::printf("registration refused (the arena copy serves): %s\n", refused.c_str());
    EXPECT_EQ(store.RegisteredBytes(), 0);
  } else {
    EXPECT_EQ(store.RegisteredBytes(), store.MappedBytes());
    EXPECT_GT(store.RegisteredBytes(), 0);
  }
  store.RelocateMasters([&d](at::IntArrayRef sizes, at::ScalarType dt) { return d.EmptyHost(sizes, dt); });
  std::vector<at::Tensor> up(static_cast<size_t>(store.num_params()));
  d.stream(StreamKind::kParamUp).Enqueue({"up", 0, 0, 0}, [&] {
    for (int i = 0; i < store.num_params(); ++i) up[static_cast<size_t>(i)] = d.Upload(store.param(i).master);
  });
  d.SynchronizeAll();
  for (int i = 0; i < store.num_params(); ++i) {
    const workers::HostParam& p = store.param(i);
    EXPECT_TRUE(at::equal(up[static_cast<size_t>(i)].cpu(), p.master)) << p.name;
    EXPECT_EQ(p.mapped, refused.empty() && !p.trainable) << p.name;
  }
}

// A host Event recorded by a CUDA stream means "completed": a download ordered after it on
// another stream sees the finished result of a long kernel chain, and the timeline holds the
// chain's GPU-measured duration.
TEST(CudaDevice, RecordedEventsMeanCompletionAndTimelineHoldsGpuTimes) {
  RP_REQUIRE_GPU();
  workers::Timeline tl;
  auto devs = workers::CreateDevices("cuda:0", &tl);
  ASSERT_TRUE(devs.ok()) << devs.status();
  workers::Device& d = *(*devs)[0];
  // y <- y Q, 200 times, Q orthogonal: norm-preserving and linear (no chaos), and every partial
  // product differs completely from the full one.
  const at::Tensor a = at::randn({1024, 1024}, at::TensorOptions().dtype(at::kDouble));
  const at::Tensor q64 = std::get<0>(at::linalg_qr(at::randn({1024, 1024}, at::TensorOptions().dtype(at::kDouble))));
  at::Tensor x, q, result;
  d.stream(StreamKind::kActivationUp).Enqueue({"in", 0, 0, 0}, [&] {
    x = d.Upload(a.to(at::kFloat));
    q = d.Upload(q64.to(at::kFloat));
  });
  auto in = workers::MakeEvent();
  d.stream(StreamKind::kActivationUp).RecordEvent(in);
  d.stream(StreamKind::kCompute).WaitEvent(in);
  d.stream(StreamKind::kCompute).Enqueue({"chain", 0, 0, 0}, [&] {
    for (int i = 0; i < 200; ++i) x = at::matmul(x, q);
  });
  auto done = workers::MakeEvent();
  d.stream(StreamKind::kCompute).RecordEvent(done);
  d.stream(StreamKind::kActivationDown).WaitEvent(done);
  d.stream(StreamKind::kActivationDown).Enqueue({}, [&] { result = d.Download(x); });
  d.SynchronizeAll();
  at::Tensor want = a;
  for (int i = 0; i < 200; ++i) want = at::matmul(want, q64);
  EXPECT_LT(rp::testing::RelativeError(result.to(at::kDouble), want), 1e-3);
  bool found = false;
  for (const auto& e : tl.Entries()) {
    if (e.label != "chain") continue;
    found = true;
    EXPECT_GT(e.end_s - e.start_s, 0.0);
  }
  EXPECT_TRUE(found);
}

TEST(CudaDevice, DefaultStageMemoryCapSharesTheCard) {
  workers::Timeline tl;
  auto cpu = workers::CreateDevices("cpu:2", &tl);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(scheduler::DefaultStageMemoryCap({(*cpu)[0].get(), (*cpu)[1].get()}), 0) << "no cap on the CPU backend";
  RP_REQUIRE_GPU();
  auto one = workers::CreateDevices("cuda:0", &tl);
  auto two = workers::CreateDevices("cuda:0,0", &tl);
  ASSERT_TRUE(one.ok() && two.ok());
  const int64_t total = (*one)[0]->Memory().device_total_bytes;
  ASSERT_GT(total, 0);
  EXPECT_EQ((*two)[1]->name(), "cuda:0.1");
  const int64_t cap1 = scheduler::DefaultStageMemoryCap({(*one)[0].get()});
  const int64_t cap2 = scheduler::DefaultStageMemoryCap({(*two)[0].get(), (*two)[1].get()});
  EXPECT_EQ(cap1, total * 9 / 10 / 2);
  EXPECT_EQ(cap2, total / 2 * 9 / 10 / 2);
}

// ---- the engine: CUDA vs the CPU backend ---------------------------------------------------

JobSpec TinySpec(const std::string& family) {
  JobSpec s;
  s.name = "gpu-" + family;
  s.model.family = family;
  s.model.vocab = 67;
  s.model.hidden = 32;
  s.model.intermediate = 48;
  s.model.num_blocks = 4;
  s.model.num_heads = 4;
  s.model.num_kv_heads = 2;
  s.model.head_dim = 8;
  if (family == "qwen3") {
    s.model.qk_norm = true;
    s.model.tied_embeddings = true;
  }
  s.seed = 11;
  s.optimizer.lr = 1e-3;
  s.optimizer.eps = 1e-6;  // see controller_test: keeps noise-floor gradients from dominating
  s.microbatches = 6;
  return s;
}

struct RunResult {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> weights;
  scheduler::EngineStats stats;
};

RunResult Train(const std::string& devices, const JobSpec& spec, int steps) {
  RunResult r;
  auto engine = Engine::Create({devices});
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return r;
  auto id = (*engine)->Submit(spec);
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return r;
  for (int i = 0; i < steps; ++i) {
    EXPECT_TRUE((*engine)
                    ->FeedBatch(*id, rp::testing::ToBatch(rp::testing::RandomTokens(12, 16, spec.model.vocab, 100 + i)))
                    .ok());
  }
  EXPECT_TRUE((*engine)->CloseInput(*id).ok());
  for (int k = 0; k < 600; ++k) {
    auto ev = (*engine)->AwaitEvents(*id, 100ms);
    if (!ev.ok()) break;
    for (const JobEvent& e : *ev) {
      if (e.kind == JobEvent::Kind::kIteration) r.losses.push_back(e.stats.loss);
      if (e.kind == JobEvent::Kind::kState && e.state == JobState::kFailed) ADD_FAILURE() << e.message;
    }
    auto st = (*engine)->State(*id);
    if (st.ok() && scheduler::IsTerminal(*st)) break;
  }
  EXPECT_EQ(*(*engine)->State(*id), JobState::kSucceeded);
  auto shapes = (*engine)->ParameterShapes(*id);
  if (shapes.ok()) {
    for (const auto& [name, shape] : *shapes) r.weights[name] = rp::testing::ParameterTensor(**engine, *id, name);
  }
  r.stats = (*engine)->Stats();
  return r;
}

// A job that does not fit fails with a clear error naming the cause; the engine (and so the
// daemon) goes on and trains the next job. The allocator is capped to 1 % of the card so that
// "too big" is cheap to reach on any GPU.
TEST(CudaEngine, OutOfMemoryFailsTheJobClearlyAndTheEngineGoesOn) {
  RP_REQUIRE_GPU();
  auto engine = Engine::Create({"cuda:0"});
  ASSERT_TRUE(engine.ok()) << engine.status();
  struct RestoreFraction {
    ~RestoreFraction() { c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0); }
  } restore;
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::setMemoryFraction(0.01, 0);
  JobSpec big = TinySpec("llama");
  big.name = "too-big";
  big.model.hidden = 1024;
  big.model.intermediate = 4096;
  big.model.num_blocks = 2;
  big.model.num_heads = 8;
  big.model.num_kv_heads = 8;
  big.model.head_dim = 128;
  big.model.vocab = 1000;
  big.microbatches = 1;
  auto id = (*engine)->Submit(big);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(
      (*engine)->FeedBatch(*id, rp::testing::ToBatch(rp::testing::RandomTokens(1, 65536, big.model.vocab, 1))).ok());
  ASSERT_TRUE((*engine)->CloseInput(*id).ok());
  std::string why;
  for (int k = 0; k < 600 && why.empty(); ++k) {
    auto ev = (*engine)->AwaitEvents(*id, 100ms);
    ASSERT_TRUE(ev.ok());
    for (const JobEvent& e : *ev) {
      if (e.kind == JobEvent::Kind::kState && e.state == JobState::kFailed) why = e.message;
    }
  }
  EXPECT_EQ(*(*engine)->State(*id), JobState::kFailed);
  std::string lower = why;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  EXPECT_NE(lower.find("out of memory"), std::string::npos) << why;
  EXPECT_NE(why.find("stage slot"), std::string::npos) << "the error names where it happened: " << why;

  c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
  JobSpec small = TinySpec("qwen3");
  auto id2 = (*engine)->Submit(small);
  ASSERT_TRUE(id2.ok()) << id2.status();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(
        (*engine)->FeedBatch(*id2, rp::testing::ToBatch(rp::testing::RandomTokens(12, 16, small.model.vocab, i))).ok());
  }
  ASSERT_TRUE((*engine)->CloseInput(*id2).ok());
  for (int k = 0; k < 600; ++k) {
    auto st = (*engine)->State(*id2);
    if (st.ok() && scheduler::IsTerminal(*st)) break;
    (void)(*engine)->AwaitEvents(*id2, 100ms);
  }
  EXPECT_EQ(*(*engine)->State(*id2), JobState::kSucceeded);
}

struct Case {
  std::string family;
  at::ScalarType master;
  planning::OptimizerMode mode;
  int workers;
};

std::string Describe(const Case& c) {
  return c.family + (c.master == at::kFloat ? "_fp32" : "_bf16") +
         (c.mode == planning::OptimizerMode::kSync ? "_sync" : "_async") + "_N" + std::to_string(c.workers);
}
std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return Describe(info.param); }
void PrintTo(const Case& c, std::ostream* os) { *os << Describe(c); }

class CudaMatchesCpu : public ::testing::TestWithParam<Case> {};

TEST_P(CudaMatchesCpu, LossesAndWeights) {
  RP_REQUIRE_GPU();
  const Case& c = GetParam();
  JobSpec spec = TinySpec(c.family);
  spec.precision = c.master == at::kFloat ? scheduler::Precision::kFloat32 : scheduler::Precision::kBFloat16;
  spec.optimizer_mode = c.mode;
  const int steps = 4;
  std::string cuda = "cuda:0";
  for (int i = 1; i < c.workers; ++i) cuda += ",0";  // N workers sharing GPU 0
  const RunResult cpu = Train("cpu:" + std::to_string(c.workers), spec, steps);
  const RunResult gpu = Train(cuda, spec, steps);
  ASSERT_EQ(gpu.losses.size(), static_cast<size_t>(steps));
  ASSERT_EQ(cpu.losses.size(), static_cast<size_t>(steps));
  const bool fp32 = c.master == at::kFloat;
  // fp32: only summation order differs (cuBLAS vs CPU GEMM, flash/efficient attention vs the
  // CPU kernel). bf16: both round activations to bf16 at different points.
  const double loss_tol = fp32 ? 2e-5 : 2e-2;
  const double weight_tol = fp32 ? 2e-4 : 3e-2;
  for (int i = 0; i < steps; ++i) EXPECT_NEAR(gpu.losses[i], cpu.losses[i], loss_tol * cpu.losses[i]) << "step " << i;
  ASSERT_EQ(gpu.weights.size(), cpu.weights.size());
  for (const auto& [name, w] : cpu.weights) {
    EXPECT_LT(rp::testing::RelativeError(gpu.weights.at(name), w), weight_tol) << name;
  }
  ASSERT_EQ(gpu.stats.devices.size(), static_cast<size_t>(c.workers));
  int64_t up = 0;
  for (const auto& d : gpu.stats.devices) up += d.param_up_bytes;
  EXPECT_GT(up, 0);
  EXPECT_GT(gpu.stats.devices[0].pinned_in_use_bytes, 0) << "master copies live in the pinned arena";
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (const char* f : {"llama", "qwen3"}) {
    for (at::ScalarType m : {at::kFloat, at::kBFloat16}) {
      for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
        for (int n = 1; n <= 3; ++n) out.push_back({f, m, mode, n});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaMatchesCpu, ::testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace rp
