// GPT-OSS against transformers' own GptOssForCausalLM (made and trained by make_hf_models.py):
// attention sinks, a 4-token sliding window in blocks 0 and 2 of 24-token sequences, YaRN, q/k/v/o,
// router and expert biases, the clamped SwiGLU with interleaved gate/up columns, and the router's
// aux loss, trained two AdamW steps on one and three CPU workers, sync and async; the export
// loads back into transformers; an MXFP4 checkpoint loads bit-equal to transformers'
// dequantisation and trains; broken GPT-OSS directories are refused naming what to fix.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "tests/support/engine_values.h"
#include "tests/support/run_command.h"
#include "tests/unit/workers/io/hf_models_fixture.h"
#include "workers/io/hf_config.h"
#include "workers/io/safetensors_reader.h"
#include "workers/io/safetensors_writer.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {
namespace {

namespace fs = std::filesystem;
using rp::testing::ReadWholeFile;

// Three blocks: 4 expert tensors each (gate_up, its bias, down, its bias).
constexpr int kGptOssExpertTensors = 12;

TEST_F(HfModels, GptOssTrainsLikeTransformersOnEveryPartitionAndMode) {
  const std::string dir = dir_ + "/gptoss";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(cfg->gpt_oss());
  EXPECT_TRUE(cfg->attention_bias);
  EXPECT_EQ(cfg->sliding_window, 4);
  EXPECT_EQ(cfg->sliding_layers, (std::vector<int>{0, 2}));
  EXPECT_TRUE(cfg->rope_scaling.yarn);
  EXPECT_FALSE(cfg->rope_scaling.truncate);
  EXPECT_NEAR(cfg->rope_scaling.attention_factor, 0.1 * std::log(4.0) + 1, 1e-12);
  EXPECT_DOUBLE_EQ(cfg->swiglu_limit, 0.2);
  EXPECT_DOUBLE_EQ(cfg->router_aux_loss_coef, 0.05);
  struct Case {
    std::string devices;
    planning::Partition partition;
  };
  // Cuts between the sparse blocks, B_1 with and without one, one layer per slot.
  const std::vector<Case> cases = {
      {"cpu:1", {{3}, 2, {3}}},
      {"cpu:3", {{2, 1}, 2, {1, 2}}},
      {"cpu:3", {{1, 1, 1, 1}, 1, {1, 1, 1, 1}}},
      {"cpu:3", {{4}, 1, {1, 1, 1, 1}}},
  };
  for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
    const bool async = mode == planning::OptimizerMode::kAsync;
    auto ref = SafetensorsFile::Open(dir + (async ? "/reference_async.safetensors" : "/reference.safetensors"));
    ASSERT_TRUE(ref.ok()) << ref.status();
    const at::Tensor tokens = *(*ref)->Read("tokens", at::kLong);
    ASSERT_GT(tokens.size(1), 2 * cfg->sliding_window);
    for (const Case& c : cases) {
      SCOPED_TRACE(c.devices + " " + c.partition.ToString() + (async ? " async" : " sync"));
      MoeRun run = RunTwoSteps(*cfg, dir, c.devices, c.partition, mode, tokens);
      ExpectTrainedLikeReference(run, **ref, c.partition, async, kGptOssExpertTensors);
      if (async || c.partition.ToString() != cases[2].partition.ToString()) continue;
      // The hub's layout for GPT-OSS: experts stacked, as transformers holds them.
      const std::string out = dir + "-export";
      ExpectExportLoadsInTransformers(run, *cfg, out, "model.layers.2.mlp.experts.gate_up_proj");
      auto index = ReadWholeFile(out + "/model.safetensors.index.json");
      EXPECT_NE(index.find("model.layers.2.mlp.experts.gate_up_proj_bias"), std::string::npos);
      EXPECT_NE(index.find("model.layers.0.self_attn.sinks"), std::string::npos);
      auto again = files::ReadHfConfig(out);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->sliding_layers, cfg->sliding_layers);
      EXPECT_DOUBLE_EQ(again->rope_scaling.attention_factor, cfg->rope_scaling.attention_factor);
    }
  }
}

// attention_bias false (GptOssConfig allows it): no q/k/v/o biases, the rest of GPT-OSS as above;
// trains like transformers and exports with the flag kept and no attention bias tensors.
TEST_F(HfModels, GptOssWithoutAttentionBiasesTrainsLikeTransformersAndExportsSo) {
  const std::string dir = dir_ + "/gptoss_nobias";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(cfg->gpt_oss());
  EXPECT_FALSE(cfg->attention_bias);
  auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  const at::Tensor tokens = *(*ref)->Read("tokens", at::kLong);
  const planning::Partition partition = {{2, 1}, 2, {1, 2}};
  MoeRun run = RunTwoSteps(*cfg, dir, "cpu:3", partition, planning::OptimizerMode::kSync, tokens);
  ExpectTrainedLikeReference(run, **ref, partition, /*async=*/false, kGptOssExpertTensors);
  const std::string out = dir + "-export";
  ExpectExportLoadsInTransformers(run, *cfg, out, "model.layers.2.mlp.experts.gate_up_proj");
  EXPECT_EQ(ReadWholeFile(out + "/model.safetensors.index.json").find("self_attn.q_proj.bias"), std::string::npos);
  auto again = files::ReadHfConfig(out);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->attention_bias);
}

// openai's checkpoints store the experts in MXFP4 (`_blocks` + `_scales`, quantization_config
// mxfp4). They load dequantised, bit-equal to transformers' convert_moe_packed_tensors, and train
// like transformers' model holding those weights.
TEST_F(HfModels, GptOssMxfp4CheckpointLoadsAsTransformersDequantisesItAndTrains) {
  const std::string dir = dir_ + "/gptoss_mxfp4";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  HostModelStore store(*cfg, at::kFloat, 1);
  ASSERT_TRUE(LoadHfWeights(dir, &store).ok());
  int packed = 0;
  for (const TensorInfo& t : (*ref)->tensors()) {
    if (t.name.rfind("loaded.", 0) != 0) continue;
    const std::string name = t.name.substr(7);
    EXPECT_TRUE(at::equal(store.param(store.FindParam(name)).fp32, *(*ref)->Read(t.name, at::kFloat))) << name;
    ++packed;
  }
  EXPECT_EQ(packed, 6);  // gate_up and down of three blocks
  const planning::Partition partition{{3}, 2, {3}};
  MoeRun run =
      RunTwoSteps(*cfg, dir, "cpu:1", partition, planning::OptimizerMode::kSync, *(*ref)->Read("tokens", at::kLong));
  ExpectTrainedLikeReference(run, **ref, partition, false, kGptOssExpertTensors);
}

// Rewrites `dir`'s single weight file into `broken` with `edit` applied to each tensor (returning
// false drops it).
void RewriteWeights(const std::string& dir, const std::string& broken,
                    const std::function<bool(const TensorInfo&, at::Tensor&)>& edit) {
  fs::create_directories(broken);
  fs::copy_file(dir + "/config.json", broken + "/config.json", fs::copy_options::overwrite_existing);
  auto file = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  std::vector<TensorDecl> decls;
  std::vector<at::Tensor> values;
  for (const TensorInfo& t : (*file)->tensors()) {
    at::Tensor v = *(*file)->Read(t.name, t.dtype);
    if (!edit(t, v)) continue;
    decls.push_back({t.name, v.scalar_type(), v.sizes().vec()});
    values.push_back(v.contiguous());
  }
  SafetensorsWriter w;
  ASSERT_TRUE(w.Open(broken + "/model.safetensors", decls).ok());
  for (const at::Tensor& v : values) ASSERT_TRUE(w.Add(v).ok());
  ASSERT_TRUE(w.Finish().ok());
}

void ExpectRefused(const absl::Status& st, const std::string& needle) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(needle), std::string::npos) << st;
}

TEST_F(HfModels, BrokenGptOssDirectoriesAreRefusedNamingTheFieldOrTensor) {
  const std::string text = ReadWholeFile(dir_ + "/gptoss_mxfp4/config.json");
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    EXPECT_NE(t.find(from), std::string::npos) << from;
    if (t.find(from) != std::string::npos) t.replace(t.find(from), from.size(), to);
    return files::ParseHfConfig(t).status();
  };
  ExpectRefused(edited("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5"),
                "num_experts_per_tok 5 is above num_local_experts 4");
  ExpectRefused(edited("\"full_attention\",", ""), "layer_types must list 3 entries");
  ExpectRefused(edited("\"full_attention\"", "\"chunked_attention\""),
                "layer_types[1] must be sliding_attention or full_attention");
  ExpectRefused(edited("\"swiglu_limit\": 0.2", "\"swiglu_limit\": -1"),
                "swiglu_limit must be a finite positive number");
  ExpectRefused(edited("\"factor\": 4.0", "\"factor\": \"x\""), "yarn rope scaling needs a number factor");
  ExpectRefused(edited("\"rope_type\": \"yarn\"", "\"rope_type\": \"longrope\""), "rope type 'longrope'");
  ExpectRefused(edited("\"quant_method\": \"mxfp4\"", "\"quant_method\": \"fp8\""),
                "quantization_config: quant_method 'fp8'");
  // Weights: half an MXFP4 pair, a misshapen MXFP4 block, a misshapen stacked bias.
  const std::string dir = dir_ + "/gptoss_mxfp4";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  RewriteWeights(dir, dir_ + "/gptoss-broken-0", [](const TensorInfo& t, at::Tensor&) {
    return t.name != "model.layers.1.mlp.experts.down_proj_scales";
  });
  ExpectRefused(CheckHfWeights(dir_ + "/gptoss-broken-0", *cfg), "model.layers.1.mlp.experts.down_proj_scales");
  RewriteWeights(dir, dir_ + "/gptoss-broken-1", [](const TensorInfo& t, at::Tensor& v) {
    if (t.name == "model.layers.2.mlp.experts.gate_up_proj_blocks") v = v.narrow(1, 0, 63);
    return true;
  });
  ExpectRefused(CheckHfWeights(dir_ + "/gptoss-broken-1", *cfg), "model.layers.2.mlp.experts.gate_up_proj_blocks");
  RewriteWeights(dir, dir_ + "/gptoss-broken-2", [](const TensorInfo& t, at::Tensor& v) {
    if (t.name == "model.layers.0.mlp.experts.down_proj_bias") v = v.narrow(1, 0, 31);
    return true;
  });
  ExpectRefused(CheckHfWeights(dir_ + "/gptoss-broken-2", *cfg), "model.layers.0.mlp.experts.down_proj_bias");
}

}  // namespace
}  // namespace rp::workers::io
