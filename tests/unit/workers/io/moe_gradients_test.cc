// moe_gradients_test — every parameter's gradient of one iteration, element by element, against
// transformers' (make_hf_models.py's grad.<name>: the CE over each micro-batch's tokens / the
// batch's, plus coef × aux_loss / M of each micro-batch's forward), for both MoE families, with
// the router's load-balancing loss on and off, dense blocks among the sparse ones
// (mlp_only_layers), on one worker and on three with partitions that cut between the sparse
// blocks. A weight comparison after AdamW steps cannot see a wrong gradient (with eps 1e-8 the
// first steps move each weight by about lr whatever its gradient), and a gradient norm hides one
// wrong layer among many: this compares each gradient.
//
// The engine's gradient is read through its optimizer: two SGD steps (no momentum, no decay) of
// lr 1e4 and 2e4 from the same weights give w - 1e4 g and w - 2e4 g, so g = (w1 - w2) / 1e4 to
// fp32's relative precision.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include <map>
#include <string>

#include "tests/support/engine_values.h"
#include "tests/unit/workers/io/hf_models_fixture.h"
#include "workers/io/hf_config.h"

namespace rp::workers::io {
namespace {

std::map<std::string, at::Tensor> Weights(const MoeRun& run) {
  std::map<std::string, at::Tensor> out;
  auto shapes = run.engine->ParameterShapes(run.id);
  EXPECT_TRUE(shapes.ok());
  if (!shapes.ok()) return out;
  for (const auto& [name, shape] : *shapes) {
    out[name] = rp::testing::ParameterTensor(*run.engine, run.id, name).to(at::kDouble);
  }
  return out;
}

std::map<std::string, at::Tensor> EngineGradients(const spec::ModelConfig& cfg, const std::string& dir,
                                                  const std::string& devices, const planning::Partition& partition,
                                                  const at::Tensor& tokens, int microbatches) {
  spec::OptimizerSpec sgd;
  sgd.algorithm = spec::OptimizerAlgorithm::kSgd;
  sgd.weight_decay = 0;
  sgd.momentum = 0;
  sgd.lr = 1e4;
  const MoeRun one =
      RunSteps(cfg, dir, devices, partition, planning::OptimizerMode::kSync, tokens, sgd, 1, microbatches);
  sgd.lr = 2e4;
  const MoeRun two =
      RunSteps(cfg, dir, devices, partition, planning::OptimizerMode::kSync, tokens, sgd, 1, microbatches);
  EXPECT_EQ(one.stats.size(), 1u);
  EXPECT_EQ(two.stats.size(), 1u);
  std::map<std::string, at::Tensor> g = Weights(one);
  const std::map<std::string, at::Tensor> w2 = Weights(two);
  for (auto& [name, w1] : g) w1 = (w1 - w2.at(name)) / 1e4;
  return g;
}

// Each gradient within 1e-4 of its tensor's largest entry, plus 1e-4 relative.
void ExpectGradientsOfReference(const std::map<std::string, at::Tensor>& got, SafetensorsFile& ref) {
  ASSERT_FALSE(got.empty());
  for (const auto& [name, g] : got) {
    const at::Tensor want = *ref.Read("grad." + name, at::kDouble);
    const double scale = want.abs().max().item<double>();
    const at::Tensor diff = (g - want).abs();
    const at::Tensor ok = diff.le(1e-4 * scale + 1e-4 * want.abs() + 1e-9);
    EXPECT_TRUE(ok.all().item<bool>()) << name << ": largest difference " << diff.max().item<double>()
                                       << " (relative to the tensor's largest gradient "
                                       << diff.max().item<double>() / std::max(scale, 1e-30) << ")";
  }
}

struct Case {
  std::string devices;
  planning::Partition partition;
};

// `microbatches`: how the reference split the batch (4: a sequence each; 1: the whole batch).
void ExpectEveryGradient(const std::string& dir, const std::vector<Case>& cases, int microbatches) {
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  const at::Tensor tokens = *(*ref)->Read("tokens", at::kLong);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.devices + " " + c.partition.ToString());
    ExpectGradientsOfReference(EngineGradients(*cfg, dir, c.devices, c.partition, tokens, microbatches), **ref);
  }
}

// Embedding, three blocks, head: B_1 holding the last block and the head, or the head alone.
const std::vector<Case> kThreeBlocks = {
    {"cpu:1", {{3}, 2, {3}}},
    {"cpu:3", {{2, 1}, 2, {1, 2}}},
    {"cpu:3", {{1, 1, 1, 1}, 1, {1, 1, 1, 1}}},
};

TEST_F(HfModels, Qwen3MoeGradientsEqualTransformersWithoutTheAuxLoss) {
  ExpectEveryGradient(dir_ + "/qwen3moe", kThreeBlocks, 4);
}
// Block 1 dense (mlp_only_layers [1]), coefficient 0.05, a sequence per micro-batch.
TEST_F(HfModels, Qwen3MoeGradientsEqualTransformersWithTheAuxLoss) {
  ExpectEveryGradient(dir_ + "/qwen3moe_aux", kThreeBlocks, 4);
}
// Eight experts, the last block dense (mlp_only_layers [2]), coefficient 0.01, the whole batch of
// 4 x 24 one micro-batch (the aux loss's statistics over all its rows).
TEST_F(HfModels, Qwen3MoeGradientsEqualTransformersWithTheAuxLossOverAWholeBatch) {
  ExpectEveryGradient(dir_ + "/qwen3moe_aux_batch",
                      {{"cpu:1", {{3}, 2, {3}}}, {"cpu:1", {{1, 1, 1, 1}, 1, {1, 1, 1, 1}}}}, 1);
}
// decoder_sparse_step 2: blocks 1 and 3 of four sparse.
TEST_F(HfModels, Qwen3MoeGradientsEqualTransformersWithSparseStepTwo) {
  ExpectEveryGradient(
      dir_ + "/qwen3moe_step2",
      {{"cpu:1", {{4}, 2, {4}}}, {"cpu:3", {{2, 2}, 2, {2, 2}}}, {"cpu:3", {{1, 1, 1, 1, 1}, 1, {1, 1, 1, 1, 1}}}}, 4);
}
TEST_F(HfModels, GptOssGradientsEqualTransformersWithTheAuxLoss) {
  ExpectEveryGradient(dir_ + "/gptoss", kThreeBlocks, 4);
}

// The same model and batch trained three AdamW steps where the update follows the gradient
// (lr 1e-2, eps 0.1 >> sqrt(v)): every weight after them against transformers', relative to how
// far the weights moved, so a gradient error in any of the three steps shows.
TEST_F(HfModels, Qwen3MoeWithTheAuxLossTrainsThreeGradientLinearStepsLikeTransformers) {
  const std::string dir = dir_ + "/qwen3moe_aux_batch";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto ref = SafetensorsFile::Open(dir + "/reference_linear.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  const at::Tensor tokens = *(*ref)->Read("tokens", at::kLong);
  const at::Tensor losses = *(*ref)->Read("losses", at::kDouble);
  spec::OptimizerSpec adamw;
  adamw.lr = 1e-2;
  adamw.eps = 0.1;
  adamw.weight_decay = 0;
  for (const Case& c : std::vector<Case>{{"cpu:1", {{3}, 2, {3}}}, {"cpu:1", {{1, 1, 1, 1}, 1, {1, 1, 1, 1}}}}) {
    SCOPED_TRACE(c.devices + " " + c.partition.ToString());
    const MoeRun start =
        RunSteps(*cfg, dir, c.devices, c.partition, planning::OptimizerMode::kSync, tokens, adamw, 0, 1);
    const MoeRun run = RunSteps(*cfg, dir, c.devices, c.partition, planning::OptimizerMode::kSync, tokens, adamw, 3, 1);
    ASSERT_EQ(run.stats.size(), 3u);
    for (int s = 0; s < 3; ++s) EXPECT_NEAR(run.stats[s].loss, losses[s].item<double>(), 2e-6) << "step " << s + 1;
    const auto w0 = Weights(start);
    for (const auto& [name, got] : Weights(run)) {
      const at::Tensor want = *(*ref)->Read("after." + name, at::kDouble);
      const double moved = (want - w0.at(name)).abs().max().item<double>();
      const double diff = (got - want).abs().max().item<double>();
      // Plus one fp32 ulp of the weight: a norm weight near 1 that moved 5e-4 may land one
      // rounding step away (seen on a fresh Debian: off by 1.19e-7 = 2^-23).
      const double ulp = std::ldexp(want.abs().max().item<double>(), -23);
      EXPECT_LE(diff, 1e-4 * moved + ulp) << name << ": moved " << moved << ", off by " << diff;
    }
  }
}

}  // namespace
}  // namespace rp::workers::io
