// peft_adapter_test — a PEFT adapter directory is read whole: adapter_config.json's rank, alpha
// and targets against the job's model.lora (tensors of the right shapes alone used to load an
// adapter of another rank or scale silently).
#include <gtest/gtest.h>

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
  auto cfg = ReadHfConfig(base);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto lora = ReadPeftConfig(adapter);
  ASSERT_TRUE(lora.ok()) << lora.status();
  auto engine = scheduler::Engine::Create({"cpu:1"});
  ASSERT_TRUE(engine.ok());
  auto submit = [&](const models::LoraConfig& l) {
    models::TransformerConfig c = *cfg;
    c.lora = l;
    scheduler::JobSpec spec;
    spec.model = rp::testing::ModelOf(c);
    spec.hf_dir = base;
    spec.lora_adapter_dir = adapter;
    return (*engine)->Submit(spec).status();
  };
  EXPECT_TRUE(submit(*lora).ok()) << submit(*lora);
  models::LoraConfig alpha = *lora;
  alpha.alpha *= 2;
  EXPECT_NE(submit(alpha).message().find("adapter_config.json has r = 4, lora_alpha = 8"), std::string::npos)
      << submit(alpha);
  models::LoraConfig targets = *lora;
  targets.targets.pop_back();
  EXPECT_NE(submit(targets).message().find("adapter_config.json targets ["), std::string::npos) << submit(targets);
}

}  // namespace
}  // namespace rp::workers::io
