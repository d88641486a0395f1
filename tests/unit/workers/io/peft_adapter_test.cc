// peft_adapter_test — a PEFT adapter directory is read whole: adapter_config.json's rank, alpha
// and targets against the job's model.lora (tensors of the right shapes alone used to load an
// adapter of another rank or scale silently).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"

#include "scheduler/engine.h"
#include "tests/support/engine_values.h"
#include "tests/unit/workers/io/hf_models_fixture.h"
#include "workers/io/hf_config.h"

namespace rp::workers::io {
namespace {

// adapter_config.json is read and compared with the job: an adapter of another rank, alpha or
// set of targets is refused at Submit naming both sides (with tensors of the right shapes it
// used to load silently).
TEST_F(HfModels, AnAdapterOfAnotherRankAlphaOrTargetsIsRefused) {
  const std::string base = dir_ + "/lora/base", adapter = dir_ + "/lora/adapter";
  auto cfg = files::ReadHfConfig(base);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto lora = files::ReadPeftConfig(adapter);
  ASSERT_TRUE(lora.ok()) << lora.status();
  auto engine = scheduler::Engine::Create({"cpu:1"});
  ASSERT_TRUE(engine.ok());
  auto submit = [&](const spec::LoraSpec& l) {
    spec::ModelConfig c = *cfg;
    c.lora = l;
    scheduler::JobSpec spec;
    spec.model = c;
    spec.hf_dir = base;
    spec.lora_adapter_dir = adapter;
    return (*engine)->Submit(spec).status();
  };
  EXPECT_TRUE(submit(*lora).ok()) << submit(*lora);
  spec::LoraSpec alpha = *lora;
  alpha.alpha *= 2;
  EXPECT_NE(submit(alpha).message().find("adapter_config.json has r = 4, lora_alpha = 8"), std::string::npos)
      << submit(alpha);
  spec::LoraSpec targets = *lora;
  targets.targets.pop_back();
  EXPECT_NE(submit(targets).message().find("adapter_config.json targets ["), std::string::npos) << submit(targets);
}

TEST(PeftBaseModel, NamesAreComparedByTheirLastComponentOrTheirPath) {
  EXPECT_EQ(*files::ParsePeftBaseModel(R"({"base_model_name_or_path": "Qwen/Qwen3-1.7B"})"), "Qwen/Qwen3-1.7B");
  EXPECT_EQ(*files::ParsePeftBaseModel(R"({"base_model_name_or_path": null})"), "");
  EXPECT_EQ(*files::ParsePeftBaseModel("{}"), "");
  EXPECT_EQ(files::ParsePeftBaseModel(R"({"base_model_name_or_path": 7})").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(files::ParsePeftBaseModel(std::string(100000, '[')).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(files::SameBaseModel("Qwen/Qwen3-1.7B", "/models/qwen3-1.7b/"));
  EXPECT_TRUE(files::SameBaseModel("/data/models/../models/llama", "/data/models/llama"));
  EXPECT_TRUE(files::SameBaseModel("", "/models/llama"));
  EXPECT_TRUE(files::SameBaseModel("meta-llama/Llama-3.2-1B", ""));
  EXPECT_FALSE(files::SameBaseModel("Qwen/Qwen3-1.7B", "/models/Qwen3-4B"));
  EXPECT_FALSE(files::SameBaseModel("/data/a/base", "/data/b/other"));
}

// An adapter whose adapter_config.json names another base (shapes, rank, alpha and targets all
// agree) loads, and the job says so in a warning; one naming this base does not warn.
TEST_F(HfModels, AnAdapterNamingAnotherBaseModelIsWarnedAbout) {
  const std::string base = dir_ + "/lora/base";
  auto cfg = files::ReadHfConfig(base);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto lora = files::ReadPeftConfig(dir_ + "/lora/adapter");
  ASSERT_TRUE(lora.ok()) << lora.status();
  auto engine = scheduler::Engine::Create({"cpu:1"});
  ASSERT_TRUE(engine.ok());
  const std::filesystem::path tmp =
      std::filesystem::temp_directory_path() / ("rp_peft_base_" + std::to_string(getpid()));
  for (const std::string& named : {std::string("other-org/Other-7B"), base}) {
    std::filesystem::remove_all(tmp);
    std::filesystem::copy(dir_ + "/lora/adapter", tmp, std::filesystem::copy_options::recursive);
    nlohmann::json j = nlohmann::json::parse(std::ifstream(tmp / "adapter_config.json"));
    j["base_model_name_or_path"] = named;
    std::ofstream(tmp / "adapter_config.json") << j.dump();
    spec::ModelConfig c = *cfg;
    c.lora = *lora;
    scheduler::JobSpec spec;
    spec.model = c;
    spec.hf_dir = base;
    spec.lora_adapter_dir = tmp.string();
    auto id = (*engine)->Submit(spec);
    ASSERT_TRUE(id.ok()) << id.status();
    std::string warning;
    bool loading = false;
    auto collect = [&](std::chrono::milliseconds wait) {
      auto events = (*engine)->AwaitEvents(*id, wait);
      ASSERT_TRUE(events.ok()) << events.status();
      for (const scheduler::JobEvent& e : *events) {
        if (e.message.find("warning: the adapter") != std::string::npos) warning = e.message;
        loading = loading || e.message.find("loading the LoRA adapter") != std::string::npos;
      }
    };
    for (int i = 0; i < 200 && !loading; ++i) collect(std::chrono::milliseconds(100));
    ASSERT_TRUE(loading);
    (void)(*engine)->Parameter(*id, "model.norm.weight");  // waits for the build (run_mu)
    collect(std::chrono::milliseconds(200));
    if (named == base) {
      EXPECT_EQ(warning, "");
    } else {
      EXPECT_NE(warning.find("names the base model 'other-org/Other-7B', this job's base is '" + base),
                std::string::npos)
          << warning;
    }
    ASSERT_TRUE((*engine)->Cancel(*id).ok());
  }
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace rp::workers::io
