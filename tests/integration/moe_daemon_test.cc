// MoE jobs through the real roundpiped process (ARCHITECTURE §6) from Hugging Face directories
// made by transformers itself: streamed steps equal to transformers' losses and weights, exports in
// the hub's layout, the router's auxiliary loss over the daemon's spec path, broken directories
// refused naming the field or the tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"
#include "tests/integration/fixtures.h"
#include "tests/support/oracle_cache.h"
#include "workers/io/safetensors_reader.h"
#include "workers/io/safetensors_writer.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;

constexpr char kHfModels[] = RP_SOURCE_DIR "/tests/unit/workers/io/make_hf_models.py";

// MoE jobs through roundpiped from Hugging Face directories (made by transformers itself): two
// streamed steps with transformers' losses, an export in the hub's layout that transformers loads
// with the trained weights; broken directories are refused with INVALID_ARGUMENT naming the field
// or the tensor, and the daemon carries on.
class MoeDaemonTest : public DaemonTest {
 protected:
  // make_hf_models.py's `model` (made once per script version: CachedOracle) copied into the
  // allowed root; empty, with a failure naming the oracle and its output, when the script fails.
  std::string ModelDir(const std::string& model) {
    auto made = CachedOracle(RP_VENV_PYTHON, kHfModels, " --only " + model);
    if (!made.ok()) {
      ADD_FAILURE() << made.status();
      return "";
    }
    const std::string dir = root_ + "/data/hf/" + model;
    std::filesystem::create_directories(dir);
    std::filesystem::copy(*made + "/" + model, dir, std::filesystem::copy_options::recursive);
    return dir;
  }

  // Makes make_hf_models.py's `model`, trains it two steps (sequences of 24, micro-batches of 1,
  // sync) and checks the losses and the export, which must hold tensor `exported_name`. Returns
  // the model directory (empty, with a failure naming the oracle, when make_hf_models.py fails).
  std::string TrainsLikeTransformersAndExports(const std::string& model, const std::string& exported_name,
                                               v1::JobSpec* spec) {
    const std::string dir = ModelDir(model);
    if (dir.empty()) return "";
    std::string log;
    EXPECT_TRUE(StartDaemon());
    auto c = daemon_.Connect();
    spec->mutable_model()->set_hf_dir(dir);
    spec->set_precision(v1::PRECISION_FP32);
    spec->mutable_optimizer()->set_lr(1e-3);
    spec->mutable_optimizer()->set_mode(v1::OPTIMIZER_MODE_SYNC);
    spec->mutable_batching()->set_global_batch(4);
    spec->mutable_batching()->set_micro_batch(1);
    spec->mutable_batching()->set_sequence_length(24);
    auto job = c->Submit(*spec);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return dir;
    Watcher w(*c, job->id());
    auto ref = workers::io::SafetensorsFile::Open(dir + "/reference.safetensors");
    EXPECT_TRUE(ref.ok()) << ref.status();
    const at::Tensor tokens = (*(*ref)->Read("tokens", at::kLong)).to(at::kInt).contiguous();
    const at::Tensor want_losses = *(*ref)->Read("losses", at::kDouble);
    std::vector<int32_t> stream(tokens.data_ptr<int32_t>(), tokens.data_ptr<int32_t>() + tokens.numel());
    stream.insert(stream.end(), stream.begin(), stream.end());  // the same batch twice, as the reference
    auto summary = c->StreamTokens(job->id(), stream, 4, 24);
    EXPECT_TRUE(summary.ok()) << summary.status();
    EXPECT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
    const std::vector<double> losses = w.Losses();
    EXPECT_EQ(losses.size(), 2u);
    for (size_t s = 0; s < std::min<size_t>(2, losses.size()); ++s) {
      EXPECT_NEAR(losses[s], want_losses[static_cast<int64_t>(s)].item<double>(), 2e-5) << "step " << s + 1;
    }
    auto path = c->Export(job->id(), root_ + "/data/" + model + "-export");
    EXPECT_TRUE(path.ok()) << path.status();
    if (!path.ok()) return dir;
    EXPECT_TRUE(ReadSafetensors(*path + "/model.safetensors").count(exported_name));
    EXPECT_EQ(RunCommand(std::string(RP_VENV_PYTHON) + " " + kHfModels + " --check-close " + *path + " " + dir, &log),
              0)
        << log;
    return dir;
  }
};

TEST_F(MoeDaemonTest, Qwen3MoeJobFromAnHfDirTrainsLikeTransformersAndExports) {
  v1::JobSpec spec;
  const std::string dir =
      TrainsLikeTransformersAndExports("qwen3moe", "model.layers.2.mlp.experts.5.down_proj.weight", &spec);
  ASSERT_FALSE(dir.empty());
  auto c = daemon_.Connect();
  // Broken directories: top-k above the experts; an expert tensor missing.
  const std::string bad_topk = root_ + "/data/bad-topk";
  std::filesystem::create_directories(bad_topk);
  std::filesystem::copy_file(dir + "/model.safetensors", bad_topk + "/model.safetensors");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  cfg["num_experts_per_tok"] = 9;
  std::ofstream(bad_topk + "/config.json") << cfg.dump();
  const std::string missing = root_ + "/data/missing-expert";
  std::filesystem::create_directories(missing);
  std::filesystem::copy_file(dir + "/config.json", missing + "/config.json");
  {
    std::vector<workers::io::TensorDecl> decls;
    std::vector<at::Tensor> kept;
    for (const auto& [name, t] : ReadSafetensors(dir + "/model.safetensors")) {
      if (name == "model.layers.0.mlp.experts.3.up_proj.weight") continue;
      decls.push_back({name, at::kFloat, t.sizes().vec()});
      kept.push_back(t);
    }
    workers::io::SafetensorsWriter writer;
    ASSERT_TRUE(writer.Open(missing + "/model.safetensors", decls).ok());
    for (const at::Tensor& t : kept) ASSERT_TRUE(writer.Add(t).ok());
    ASSERT_TRUE(writer.Finish().ok());
  }
  for (const auto& [where, needle] : {std::pair{bad_topk, std::string("num_experts_per_tok 9")},
                                      std::pair{missing, std::string("model.layers.0.mlp.experts.3.up_proj.weight")}}) {
    v1::JobSpec bad = spec;
    bad.mutable_model()->set_hf_dir(where);
    auto st = c->Submit(bad).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st;
  }
  EXPECT_TRUE(c->List().ok());  // still serving
  EXPECT_EQ(daemon_.Stop(), 0) << daemon_.Output();
}

// GPT-OSS (sinks, sliding blocks, YaRN, biases, clamped SwiGLU, the router's aux loss from its
// config.json) the same way: its export keeps the experts stacked, as the hub does; a config.json
// whose layer_types does not cover every block is refused naming the field.
TEST_F(MoeDaemonTest, GptOssJobFromAnHfDirTrainsLikeTransformersAndExports) {
  v1::JobSpec spec;
  const std::string dir = TrainsLikeTransformersAndExports("gptoss", "model.layers.2.mlp.experts.gate_up_proj", &spec);
  ASSERT_FALSE(dir.empty());
  auto c = daemon_.Connect();
  const std::string bad_types = root_ + "/data/bad-layer-types";
  std::filesystem::create_directories(bad_types);
  std::filesystem::copy_file(dir + "/model.safetensors", bad_types + "/model.safetensors");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  cfg["layer_types"] = {"sliding_attention", "full_attention"};
  std::ofstream(bad_types + "/config.json") << cfg.dump();
  v1::JobSpec bad = spec;
  bad.mutable_model()->set_hf_dir(bad_types);
  auto st = c->Submit(bad).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("layer_types must list 3 entries"), std::string::npos) << st;
  EXPECT_TRUE(c->List().ok());  // still serving
  EXPECT_EQ(daemon_.Stop(), 0) << daemon_.Output();
}

// The router's load-balancing loss through the daemon's own path (config.json, or the spec's
// model.router_aux_loss_coef, -> the engine's model), three AdamW steps at lr 1e-2 and eps 0.1 (the
// update follows the gradient, so a gradient error in any tensor at any step shows): every loss
// equals transformers' and every exported tensor lies within 1e-4 of how far transformers moved it.
//  - the job: eight experts, top-2, norm_topk_prob, the last block dense, coefficient 0.01
//    from config.json, the whole 4 x 24 batch as one micro-batch, on one worker;
//  - six experts, block 1 dense, coefficient 0.05 given only by the spec (config.json says
//    output_router_logits false), a micro-batch per sequence on three workers.
TEST_F(MoeDaemonTest, TheRouterAuxLossTrainsLikeTransformersThroughTheDaemon) {
  struct Case {
    std::string model;
    int workers, micro_batch;
    double spec_coef;  // 0: none in the spec
  };
  for (const Case& k : {Case{"qwen3moe_aux_batch", 1, 4, 0}, Case{"qwen3moe_aux", 3, 1, 0.05}}) {
    SCOPED_TRACE(k.model + " on cpu:" + std::to_string(k.workers));
    const std::string dir = ModelDir(k.model);
    ASSERT_FALSE(dir.empty());
    if (k.spec_coef > 0) {
      nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
      cfg["output_router_logits"] = false;
      std::ofstream(dir + "/config.json") << cfg.dump();
    }
    auto ref = workers::io::SafetensorsFile::Open(dir + "/reference_linear.safetensors");
    ASSERT_TRUE(ref.ok()) << ref.status();
    const at::Tensor tokens = (*(*ref)->Read("tokens", at::kLong)).to(at::kInt).contiguous();
    const at::Tensor want_losses = *(*ref)->Read("losses", at::kDouble);
    ASSERT_EQ(want_losses.numel(), 3);
    std::vector<int32_t> stream;
    for (int step = 0; step < 3; ++step) {
      stream.insert(stream.end(), tokens.data_ptr<int32_t>(), tokens.data_ptr<int32_t>() + tokens.numel());
    }
    ASSERT_TRUE(StartDaemon({"--devices", "cpu:" + std::to_string(k.workers)}));
    auto c = daemon_.Connect();
    v1::JobSpec spec;
    spec.mutable_model()->set_hf_dir(dir);
    if (k.spec_coef > 0) spec.mutable_model()->set_router_aux_loss_coef(k.spec_coef);
    spec.set_precision(v1::PRECISION_FP32);
    spec.mutable_optimizer()->set_lr(1e-2);
    spec.mutable_optimizer()->set_eps(0.1);
    spec.mutable_optimizer()->set_mode(v1::OPTIMIZER_MODE_SYNC);
    spec.mutable_batching()->set_global_batch(4);
    spec.mutable_batching()->set_micro_batch(k.micro_batch);
    spec.mutable_batching()->set_sequence_length(24);
    spec.set_max_steps(3);
    auto job = c->Submit(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    Watcher w(*c, job->id());
    auto summary = c->StreamTokens(job->id(), stream, 4, 24);
    EXPECT_TRUE(summary.ok()) << summary.status();
    ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
    const std::vector<double> losses = w.Losses();
    ASSERT_EQ(losses.size(), 3u);
    for (int s = 0; s < 3; ++s) EXPECT_NEAR(losses[s], want_losses[s].item<double>(), 5e-6) << "step " << s + 1;
    auto path = c->Export(job->id(), root_ + "/data/" + k.model + "-export");
    ASSERT_TRUE(path.ok()) << path.status();
    std::string log;
    EXPECT_EQ(RunCommand(std::string(RP_VENV_PYTHON) + " " + kHfModels + " --check-moved " + *path + " " + dir + " " +
                             dir + "/reference_linear.safetensors",
                         &log),
              0)
        << log;
    std::printf("%s on cpu:%d: %s", k.model.c_str(), k.workers, log.c_str());
    EXPECT_EQ(daemon_.Stop(), 0) << daemon_.Output();
  }
}

}  // namespace
}  // namespace rp::testing
