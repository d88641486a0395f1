// LoRA through model I/O: adapters trained like peft (dense, Qwen3-MoE, GPT-OSS, the stacked
// experts' target_parameters) and exported for peft and merged; a finished LoRA job reads its
// base from the model directory again and notices a change; the frozen base keeps only its
// master copy.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "absl/strings/str_join.h"
#include "scheduler/engine.h"
#include "tests/support/engine_values.h"
#include "tests/support/run_command.h"
#include "tests/unit/workers/io/hf_models_fixture.h"
#include "workers/io/hf_config.h"
#include "workers/io/hf_export.h"
#include "workers/io/hf_tensors.h"
#include "workers/io/safetensors_reader.h"
#include "workers/io/safetensors_writer.h"
#include "workers/models/test_hooks.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using rp::testing::ReadWholeFile;
using rp::testing::RunCommand;

// LoRA against peft: a base model + a PEFT adapter (random A and B) trained two AdamW steps by
// peft; the engine loads both, trains the same steps with the base frozen: losses, gradient norms
// (adapters only) and adapter weights match; the base is untouched; the engine's PEFT export loads
// with peft and its merged export equals peft's merge_and_unload.
// A base and a PEFT adapter made by make_hf_models.py in `set` (e.g. dir/lora): the engine starts
// from the adapter, trains two steps async (the first compares with peft's) and two sync (both
// losses and every adapter after them compare; the base stays bit-equal), and its PEFT and merged
// exports are checked by peft itself.
void LoraTrainsLikePeft(const std::string& set, int expected_adapters) {
  const std::string base = set + "/base", adapter = set + "/adapter";
  auto cfg = files::ReadHfConfig(base);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto lora = files::ReadPeftConfig(adapter);
  ASSERT_TRUE(lora.ok()) << lora.status();
  cfg->lora = *lora;
  EXPECT_EQ(cfg->lora.rank, 4);
  auto ref = SafetensorsFile::Open(set + "/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  at::Tensor tokens = *(*ref)->Read("tokens", at::kLong);
  auto engine = scheduler::Engine::Create({"cpu:2"});
  scheduler::JobSpec spec;
  spec.model = *cfg;
  spec.hf_dir = base;
  spec.lora_adapter_dir = adapter;
  spec.precision = scheduler::Precision::kFloat32;
  spec.optimizer.lr = 1e-3;
  spec.optimizer.weight_decay = 0;
  spec.optimizer.eps = 1e-8;
  spec.microbatches = 2;
  spec.optimizer_mode = planning::OptimizerMode::kAsync;  // the layerwise protocol with frozen layers
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(tokens)).ok());
  ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(tokens)).ok());
  ASSERT_TRUE((*engine)->CloseInput(*id).ok());
  std::vector<scheduler::IterationStats> stats;
  std::string failure;
  for (int i = 0; i < 300 && stats.size() < 2; ++i) {
    auto ev = (*engine)->AwaitEvents(*id, 100ms);
    for (const auto& e : *ev) {
      if (e.kind == scheduler::JobEvent::Kind::kIteration) stats.push_back(e.stats);
      if (e.kind == scheduler::JobEvent::Kind::kState && !e.message.empty()) failure = e.message;
    }
    if (*(*engine)->State(*id) == scheduler::JobState::kFailed) break;
  }
  ASSERT_EQ(stats.size(), 2u) << failure;
  // Async: the second iteration's gradients are taken at the weights before the first step
  // (staleness 1), so only the first step compares with peft's synchronous run.
  EXPECT_NEAR(stats[0].loss, (*(*ref)->Read("losses", at::kDouble))[0].item<double>(), 2e-5);
  EXPECT_NEAR(stats[0].grad_norm, (*(*ref)->Read("grad_norms", at::kDouble))[0].item<double>(), 1e-4);
  for (int i = 0; i < 300 && *(*engine)->State(*id) != scheduler::JobState::kSucceeded; ++i) {
    (void)(*engine)->AwaitEvents(*id, 100ms);
  }
  // Sync run for the weights after two steps.
  scheduler::JobSpec sync = spec;
  sync.optimizer_mode = planning::OptimizerMode::kSync;
  auto sid = (*engine)->Submit(sync);
  ASSERT_TRUE(sid.ok());
  ASSERT_TRUE((*engine)->FeedBatch(*sid, rp::testing::ToBatch(tokens)).ok());
  ASSERT_TRUE((*engine)->FeedBatch(*sid, rp::testing::ToBatch(tokens)).ok());
  ASSERT_TRUE((*engine)->CloseInput(*sid).ok());
  std::vector<scheduler::IterationStats> sstats;
  for (int i = 0; i < 300 && sstats.size() < 2; ++i) {
    auto ev = (*engine)->AwaitEvents(*sid, 100ms);
    for (const auto& e : *ev) {
      if (e.kind == scheduler::JobEvent::Kind::kIteration) sstats.push_back(e.stats);
    }
  }
  ASSERT_EQ(sstats.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_NEAR(sstats[s].loss, (*(*ref)->Read("losses", at::kDouble))[s].item<double>(), 2e-5) << "step " << s + 1;
  }
  auto shapes = (*engine)->ParameterShapes(*sid);
  ASSERT_TRUE(shapes.ok());
  int adapters = 0;
  for (const auto& [name, shape] : *shapes) {
    at::Tensor got = rp::testing::ParameterTensor(**engine, *sid, name);
    if (name.find(".lora_") != std::string::npos) {
      ++adapters;
      at::Tensor want = *(*ref)->Read("after." + name, at::kFloat);
      EXPECT_TRUE(at::allclose(got, want, 1e-4, 2e-6)) << name << " " << (got - want).abs().max().item<float>();
    } else {
      auto want = ReadHfTensor(base, name, shape);  // stacks hub-layout experts
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_TRUE(at::equal(got, *want)) << name << " moved (the base is frozen)";
    }
  }
  EXPECT_EQ(adapters, expected_adapters);
  // Exports: a PEFT adapter directory and merged full weights; peft checks both.
  auto fetch = rp::testing::ParameterFetch(**engine, *sid);
  const auto named = rp::testing::NamedShapes(*shapes);
  ASSERT_TRUE(ExportPeftAdapter(set + "/engine-adapter", *cfg, named, fetch).ok());
  HfExportOptions fp32;
  fp32.dtype = at::kFloat;
  auto merged = ExportMergedLora(set + "/engine-merged", *cfg, named, fetch, fp32);
  ASSERT_TRUE(merged.ok()) << merged.status();
  std::string log;
  EXPECT_EQ(RunCommand(std::string(RP_VENV_PYTHON) + " " RP_TEST_DIR "/make_hf_models.py --check-lora " + set +
                           "/engine-adapter " + set + "/engine-merged " + base + " " + set,
                       &log),
            0)
      << log;
}

TEST_F(HfModels, LoraAdaptersTrainLikePeftAndExportForPeft) {
  LoraTrainsLikePeft(dir_ + "/lora", 2 * 5 * 2);  // A and B, 5 targets, 2 blocks
}

// LoRA on Qwen3-MoE (q/k/v/o adapters on every block, two of them sparse; the router and the
// experts frozen) against peft, and its exports loaded by peft.
TEST_F(HfModels, LoraOnQwen3MoeTrainsLikePeftAndExportsForPeft) {
  LoraTrainsLikePeft(dir_ + "/lora_moe", 2 * 4 * 3);  // A and B, 4 targets, 3 blocks
}

// The same on GPT-OSS's biased q/k/v/o projections (sinks, sliding blocks, experts frozen).
TEST_F(HfModels, LoraOnGptOssTrainsLikePeftAndExportsForPeft) {
  LoraTrainsLikePeft(dir_ + "/lora_gptoss", 2 * 4 * 3);  // A and B, 4 targets, 3 blocks
}

// LoRA on the stacked experts themselves (PEFT's target_parameters: one rank-r adapter per
// expert in two stacked tensors): Qwen3-MoE with both expert tensors and q/v (the dense block has
// no experts to adapt), GPT-OSS with gate_up alone and q.
TEST_F(HfModels, LoraOnStackedExpertsTrainsLikePeftsTargetParameters) {
  LoraTrainsLikePeft(dir_ + "/lora_moe_experts", 2 * 2 * 3 + 2 * 2 * 2);  // q, v on 3 blocks; 2 on 2 sparse
  LoraTrainsLikePeft(dir_ + "/lora_gptoss_experts", 2 * 3 + 2 * 3);       // q and gate_up on 3 blocks
}

// A LoRA job on a model directory: its checkpoints leave the base out; once the job ended its
// base parameters are read from model.hf_dir (rounded to the job's precision, as the store held
// them) and checked against the checkpoint's record, so a base file changed since is reported,
// naming the tensor, not silently exported.
TEST_F(HfModels, AFinishedLoraJobReadsItsBaseFromTheModelDirAndNoticesAChange) {
  const std::string base = dir_ + "/lora/base-copy";
  fs::remove_all(base);
  fs::copy(dir_ + "/lora/base", base);
  auto cfg = files::ReadHfConfig(base);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto lora = files::ReadPeftConfig(dir_ + "/lora/adapter");
  ASSERT_TRUE(lora.ok()) << lora.status();
  cfg->lora = *lora;
  auto ref = SafetensorsFile::Open(dir_ + "/lora/reference.safetensors");
  ASSERT_TRUE(ref.ok());
  auto engine = scheduler::Engine::Create({"cpu:2"});
  scheduler::JobSpec spec;
  spec.model = *cfg;
  spec.hf_dir = base;
  spec.precision = scheduler::Precision::kBFloat16;
  spec.checkpoint_root = dir_ + "/lora/ckpt";
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(*(*ref)->Read("tokens", at::kLong))).ok());
  ASSERT_TRUE((*engine)->CloseInput(*id).ok());
  for (int i = 0; i < 300 && *(*engine)->State(*id) != scheduler::JobState::kSucceeded; ++i) {
    (void)(*engine)->AwaitEvents(*id, 100ms);
  }
  ASSERT_EQ(*(*engine)->State(*id), scheduler::JobState::kSucceeded);
  auto file = SafetensorsFile::Open(base + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  std::vector<std::string> base_names;
  auto shapes = (*engine)->ParameterShapes(*id);  // named: the loop must not outlive a temporary
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  for (const auto& [name, shape] : *shapes) {
    if (name.find(".lora_") != std::string::npos) continue;
    base_names.push_back(name);
    at::Tensor want = (*(*file)->Read(name, at::kFloat)).to(at::kBFloat16).to(at::kFloat);
    EXPECT_TRUE(at::equal(rp::testing::ParameterTensor(**engine, *id, name), want)) << name;
  }
  ASSERT_FALSE(base_names.empty());
  // One element of the last tensor in the file changes (an exponent bit: beyond bf16 rounding).
  const TensorInfo* last = nullptr;
  for (const TensorInfo& t : (*file)->tensors()) {
    if (!last || t.end > last->end) last = &t;
  }
  ASSERT_NE(last, nullptr);
  const std::string changed = last->name;
  file->reset();
  {
    std::fstream f(base + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);  // the last byte: sign and exponent of the last fp32
    const char c = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x40));
  }
  // The runner frees the store just after the job's terminal state; until then reads come from
  // the store itself (the values the job trained on), so wait for the first read from the file.
  auto got = (*engine)->Parameter(*id, changed);
  for (int i = 0; i < 200 && got.ok(); ++i) {
    std::this_thread::sleep_for(50ms);
    got = (*engine)->Parameter(*id, changed);
  }
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_NE(got.status().message().find("base tensor " + changed), std::string::npos) << got.status();
  EXPECT_NE(got.status().message().find("changed since"), std::string::npos) << got.status();
  for (const std::string& name : base_names) {
    if (name != changed) {
      EXPECT_TRUE((*engine)->Parameter(*id, name).ok()) << name;
    }
  }
}

TEST(Lora, TheBaseKeepsOnlyItsMasterCopyAndASyntheticTaskTrains) {
  spec::ModelConfig c;
  c.family = "llama";
  c.vocab = 32;
  c.hidden = 64;
  c.intermediate = 128;
  c.num_blocks = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  spec::ModelConfig lora = c;
  lora.lora = {8, 16, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}};
  HostModelStore full(c, at::kBFloat16, 1), adapted(lora, at::kBFloat16, 1);
  int64_t base_params = 0, adapter_params = 0;
  for (int i = 0; i < adapted.num_params(); ++i) {
    const HostParam& p = adapted.param(i);
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    if (p.name.find(".lora_") != std::string::npos) {
      adapter_params += n;
      EXPECT_TRUE(p.trainable && p.fp32.defined() && p.grad.defined()) << p.name;
    } else {
      base_params += n;
      EXPECT_FALSE(p.trainable || p.fp32.defined() || p.grad.defined()) << p.name;
    }
  }
  // Host bytes: 2 per base parameter (bf16 master) + adapters with fp32, master and gradient.
  EXPECT_EQ(adapted.HostBytes(), 2 * base_params + adapter_params * (4 + 2 + 4));
  EXPECT_EQ(full.HostBytes(), base_params * (4 + 2 + 4));
  // Fine-tuning: a base fully trained on "next = token + 1" (mod 32) is adapted with LoRA alone
  // to "next = token + 2"; the loss on the new task must fall.
  auto engine = scheduler::Engine::Create({"cpu:2"});
  auto train = [&](const scheduler::JobSpec& spec, int steps, int shift) {
    auto id = (*engine)->Submit(spec);
    EXPECT_TRUE(id.ok()) << id.status();
    std::thread feeder([&] {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
      for (int i = 0; i < steps; ++i) {
        at::Tensor start = at::randint(32, {8, 1}, gen, at::TensorOptions().dtype(at::kLong));
        at::Tensor t = (start + shift * at::arange(16, at::kLong).unsqueeze(0)).remainder(32);
        (void)(*engine)->FeedBatch(*id, rp::testing::ToBatch(t));
      }
      (void)(*engine)->CloseInput(*id);
    });
    std::vector<double> losses;
    for (int i = 0; i < 900 && *(*engine)->State(*id) != scheduler::JobState::kSucceeded; ++i) {
      auto ev = (*engine)->AwaitEvents(*id, 100ms);
      for (const auto& e : *ev) {
        if (e.kind == scheduler::JobEvent::Kind::kIteration) losses.push_back(e.stats.loss);
      }
    }
    feeder.join();
    return std::make_pair(*id, losses);
  };
  scheduler::JobSpec full_ft;
  full_ft.model = c;
  full_ft.precision = scheduler::Precision::kFloat32;
  full_ft.optimizer.lr = 1e-2;
  full_ft.microbatches = 2;
  auto [base_id, base_losses] = train(full_ft, 100, 1);
  ASSERT_GE(base_losses.size(), 90u);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("rp_lora_base_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  auto shapes = (*engine)->ParameterShapes(base_id);
  HfExportOptions fp32;
  fp32.dtype = at::kFloat;
  ASSERT_TRUE(
      ExportHfModel(dir, c, rp::testing::NamedShapes(*shapes), rp::testing::ParameterFetch(**engine, base_id), fp32)
          .ok());
  scheduler::JobSpec adapt;
  adapt.model = lora;
  adapt.hf_dir = dir;
  adapt.precision = scheduler::Precision::kBFloat16;
  adapt.optimizer.lr = 1e-2;
  adapt.microbatches = 2;
  adapt.optimizer_mode = planning::OptimizerMode::kAsync;
  auto [lora_id, losses] = train(adapt, 100, 2);
  std::filesystem::remove_all(dir);
  ASSERT_GE(losses.size(), 90u);
  const double first = std::accumulate(losses.begin(), losses.begin() + 5, 0.0) / 5;
  const double last = std::accumulate(losses.end() - 10, losses.end(), 0.0) / 10;
  EXPECT_LT(last, 0.5 * first) << "LoRA did not adapt the model: " << first << " -> " << last;
  std::printf("LoRA adaptation to the +2 task: loss %.3f (first 5 steps) -> %.3f (last 10)\n", first, last);
  // The base did not move.
  auto q = (*engine)->Parameter(lora_id, "model.layers.0.self_attn.q_proj.weight");
  auto q0 = (*engine)->Parameter(base_id, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_TRUE(at::allclose(rp::testing::ToTensor(*q), rp::testing::ToTensor(*q0), 0, 1e-2));  // up to bf16 rounding
}

}  // namespace
}  // namespace rp::workers::io
