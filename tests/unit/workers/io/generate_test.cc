// Generation through the pipeline (scheduler/runtime/generate.h) against PyPI transformers'
// `generate` on the same weights: greedy ids equal token for token for every model family
// (Llama, Qwen3, Qwen3-MoE, GPT-OSS with its 4-token sliding window and sinks), prompts of
// different lengths in one pass (the longest longer than the window), on two workers; sampling
// with a seed is reproducible and depends on the seed.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/generate.h"
#include "scheduler/runtime/job_builder.h"
#include "tests/support/run_command.h"
#include "tests/unit/workers/io/hf_models_fixture.h"
#include "workers/device/device.h"
#include "workers/device/timeline.h"
#include "workers/files/hf_configs.h"
#include "workers/io/hf_config.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {
namespace {

using scheduler::runtime::Generate;
using scheduler::runtime::GenerateOptions;

const std::vector<std::vector<int32_t>> kPrompts = {
    {5, 17, 42}, {1, 2, 3, 4, 5, 6, 7}, {90, 3, 3, 61, 8, 0, 44, 12, 7}};
constexpr int kNewTokens = 6;

struct Pipeline {
  Timeline timeline;
  std::vector<std::unique_ptr<Device>> devices;
  std::unique_ptr<HostModelStore> store;
  std::unique_ptr<scheduler::Controller> controller;
};

// The model directory's weights on two CPU workers, M = 2.
std::unique_ptr<Pipeline> Load(const std::string& dir) {
  auto p = std::make_unique<Pipeline>();
  auto cfg = files::ReadHfConfig(dir);
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  if (!cfg.ok()) return nullptr;
  auto devs = CreateDevices("cpu:2", &p->timeline);
  EXPECT_TRUE(devs.ok()) << devs.status();
  if (!devs.ok()) return nullptr;
  p->devices = std::move(*devs);
  p->store = std::make_unique<HostModelStore>(*cfg, at::kFloat, 1);
  const absl::Status loaded = LoadHfWeights(dir, p->store.get());
  EXPECT_TRUE(loaded.ok()) << loaded;
  scheduler::ControllerOptions o;
  o.microbatches = 2;
  auto part = scheduler::PlanFromParameterSizes(*cfg, 2, 2);
  EXPECT_TRUE(part.ok()) << part.status();
  if (!part.ok()) return nullptr;
  o.partition = *part;
  std::vector<Device*> raw;
  for (auto& d : p->devices) raw.push_back(d.get());
  auto c = scheduler::Controller::Create(o, p->store.get(), raw, &p->timeline);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  p->controller = std::move(*c);
  return p;
}

std::vector<std::vector<int32_t>> TransformersGreedy(const std::string& dir) {
  std::string out;
  const std::string prompts = nlohmann::json(kPrompts).dump();
  const int rc = rp::testing::RunCommand(std::string(RP_VENV_PYTHON) + " " + RP_TEST_DIR + "/hf_generate.py " + dir +
                                             " " + std::to_string(kNewTokens) + " '" + prompts + "'",
                                         &out);
  EXPECT_EQ(rc, 0) << "transformers' generate failed:\n" << out;
  if (rc != 0) return {};
  // The answer is the last line (transformers may warn before it).
  const size_t end = out.find_last_not_of('\n');
  const size_t begin = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1))
      .get<std::vector<std::vector<int32_t>>>();
}

class Generation : public HfModels, public ::testing::WithParamInterface<std::string> {};

TEST_P(Generation, GreedyEqualsTransformersTokenForToken) {
  const std::string dir = dir_ + "/" + GetParam();
  auto p = Load(dir);
  ASSERT_TRUE(p);
  GenerateOptions o;
  o.max_new_tokens = kNewTokens;
  auto ours = Generate(*p->controller, kPrompts, o, 2);
  ASSERT_TRUE(ours.ok()) << ours.status();
  const auto want = TransformersGreedy(dir);
  ASSERT_EQ(want.size(), kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ((*ours)[i], want[i]) << GetParam() << " prompt " << i << " (" << kPrompts[i].size() << " tokens)";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Generation, ::testing::Values("llama", "qwen3", "qwen3moe", "gptoss"));

TEST_F(HfModels, SamplingWithASeedIsReproducibleAndDependsOnTheSeed) {
  auto p = Load(dir_ + "/gptoss");
  ASSERT_TRUE(p);
  GenerateOptions o;
  o.max_new_tokens = 8;
  o.temperature = 1.5;
  o.seed = 5;
  auto a = Generate(*p->controller, kPrompts, o, 2);
  auto b = Generate(*p->controller, kPrompts, o, 2);
  o.seed = 6;
  auto c = Generate(*p->controller, kPrompts, o, 2);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  // One prompt alone samples what it sampled beside the others (its own generator).
  auto alone = Generate(*p->controller, {kPrompts[1]}, GenerateOptions{8, 1.5, 5, {}}, 2);
  ASSERT_TRUE(alone.ok());
  EXPECT_NE((*alone)[0], (*a)[1]) << "the generator is seeded by the prompt's index too";
  o.seed = 5;
  auto first = Generate(*p->controller, {kPrompts[0]}, o, 2);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)[0], (*a)[0]);
}

TEST(PickToken, GreedyTakesTheFirstHighestAndSamplingFollowsTheCumulativeMass) {
  const float logits[4] = {1.0f, 3.0f, 3.0f, -2.0f};
  EXPECT_EQ(scheduler::runtime::PickToken(logits, 4, 0, 0), 1);
  // softmax at T = 1: p = {0.0634, 0.4683, 0.4683, 0.0000...}
  EXPECT_EQ(scheduler::runtime::PickToken(logits, 4, 1.0, 0.05), 0);
  EXPECT_EQ(scheduler::runtime::PickToken(logits, 4, 1.0, 0.10), 1);
  EXPECT_EQ(scheduler::runtime::PickToken(logits, 4, 1.0, 0.60), 2);
}

}  // namespace
}  // namespace rp::workers::io
