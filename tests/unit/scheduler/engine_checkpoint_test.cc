// Engine checkpoints: a resumed job continues bit-identically (sync, async, bf16 moments, SGD,
// Lion, Adafactor); a LoRA checkpoint holds only the adapters and refuses another base.
#include "scheduler/engine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "nlohmann/json.hpp"
#include "scheduler/job_files.h"

#include "scheduler/runtime/engine_impl.h"
#include "scheduler/runtime/model_adapter.h"
#include "tests/support/engine_values.h"
#include "tests/support/oracle_cache.h"
#include "tests/support/reference_model.h"
#include "tests/support/run_command.h"
#include "tests/support/tokens.h"
#include "tests/unit/scheduler/engine_test_jobs.h"
#include "workers/io/checkpoint.h"
#include "workers/io/safetensors_reader.h"

namespace rp::scheduler {
namespace {

// Runs `batches` through a fresh job of `spec` (optionally checkpointing after `ckpt_after`
// batches into `ckpt_dir`) and returns the final fp32 weights.
std::map<std::string, at::Tensor> Train(const JobSpec& spec, const std::vector<at::Tensor>& batches,
                                        int ckpt_after = -1, const std::string& ckpt_dir = "") {
  auto engine = Engine::Create({"cpu:2"});
  EXPECT_TRUE(engine.ok());
  auto id = (*engine)->Submit(spec);
  EXPECT_TRUE(id.ok()) << id.status();
  for (size_t i = 0; i < batches.size(); ++i) {
    EXPECT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(batches[i])).ok());
    if (static_cast<int>(i) + 1 == ckpt_after) {
      // Wait until those batches were trained, then checkpoint at the boundary.
      int trained = 0;
      for (int k = 0; k < 500 && trained < ckpt_after; ++k) {
        auto ev = (*engine)->AwaitEvents(*id, 20ms);
        for (const auto& e : *ev) trained += e.kind == JobEvent::Kind::kIteration;
      }
      auto info = (*engine)->Checkpoint(*id, "test");
      EXPECT_TRUE(info.ok()) << info.status();
      if (info.ok()) {
        EXPECT_EQ(info->batches_consumed, ckpt_after);
        EXPECT_EQ(info->step, ckpt_after);
      }
    }
  }
  EXPECT_TRUE((*engine)->CloseInput(*id).ok());
  DrainUntilEnded(**engine, *id);
  EXPECT_EQ(*(*engine)->State(*id), JobState::kSucceeded);
  std::map<std::string, at::Tensor> out;
  auto shapes = (*engine)->ParameterShapes(*id);  // (a named StatusOr: no dangling temporary)
  for (const auto& [name, shape] : *shapes) out[name] = rp::testing::ToTensor(*(*engine)->Parameter(*id, name));
  return out;
}

bool SameWeights(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    if (!at::equal(t, b.at(name))) {
      ADD_FAILURE() << name << " differs by " << (t - b.at(name)).abs().max().item<float>();
      return false;
    }
  }
  return true;
}

TEST(EngineCheckpoint, ResumeContinuesBitIdenticallySyncAndAsync) {
  const std::string root = (std::filesystem::temp_directory_path() / ("rp_ckpt_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 6; ++i) data.push_back(RandomTokens(4, 8, 41, 300 + i));
  for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
    JobSpec spec = TinyJob();
    spec.optimizer_mode = mode;
    spec.lr_schedule = {spec::LrSchedule::Kind::kWarmupCosine, 2, 6, 0.1};  // the schedule position matters
    spec.checkpoint_root = root + (mode == planning::OptimizerMode::kSync ? "/sync" : "/async");
    // Straight through, checkpointing (on request) after 3 batches on the way.
    auto straight = Train(spec, data, 3);
    // A new engine resumes from the checkpoint with the remaining batches.
    JobSpec resumed = spec;
    resumed.resume_from = spec.checkpoint_root + "/step-3";
    resumed.checkpoint_root = spec.checkpoint_root + "-resumed";
    auto continued = Train(resumed, {data.begin() + 3, data.end()});
    EXPECT_TRUE(SameWeights(straight, continued)) << (mode == planning::OptimizerMode::kSync ? "sync" : "async");
    if (mode == planning::OptimizerMode::kSync) {
      // In sync mode a checkpoint changes nothing: equal to a run that never checkpointed.
      JobSpec plain = spec;
      plain.checkpoint_root = root + "/plain";
      EXPECT_TRUE(SameWeights(Train(plain, data), straight));
    }
    // The every-N-steps policy: checkpoints at exactly 2, 4 and 6 steps (keep_last 2 keeps 4, 6);
    // resuming from step-4 with the last two batches ends where the straight run ends.
    JobSpec policy = spec;
    policy.checkpoint_root = spec.checkpoint_root + "-policy";
    policy.checkpoint_every = 2;
    policy.checkpoint_keep_last = 2;
    auto with_policy = Train(policy, data);
    EXPECT_FALSE(std::filesystem::exists(policy.checkpoint_root + "/step-2"));  // pruned
    ASSERT_TRUE(std::filesystem::exists(policy.checkpoint_root + "/step-4/meta.json"));
    JobSpec from4 = policy;
    from4.resume_from = policy.checkpoint_root + "/step-4";
    from4.checkpoint_root = policy.checkpoint_root + "-resumed";
    EXPECT_TRUE(SameWeights(with_policy, Train(from4, {data.begin() + 4, data.end()})));
  }
  // A damaged checkpoint is detected, not loaded.
  {
    std::fstream f(root + "/sync/step-3/weights.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  auto engine = Engine::Create({"cpu:2"});
  JobSpec bad = TinyJob();
  bad.resume_from = root + "/sync/step-3";
  auto id = (*engine)->Submit(bad);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kDataLoss) << id.status();
  EXPECT_NE(id.status().message().find("checksum"), std::string::npos) << id.status();
  std::filesystem::remove_all(root);
}

// bf16 moments through the engine: a run resumed from a checkpoint ends bit-identical to the
// straight run (the rounding bits are a function of seed, step and element), the checkpoint's
// optimizer state is about half the fp32 one, and the option really changes the training.
TEST(EngineCheckpoint, Bf16MomentsResumeBitIdenticallyAndHalveTheOptimizerState) {
  const std::string root = (std::filesystem::temp_directory_path() / ("rp_bf16m_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 6; ++i) data.push_back(RandomTokens(4, 8, 41, 500 + i));
  for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
    const std::string tag = mode == planning::OptimizerMode::kSync ? "sync" : "async";
    SCOPED_TRACE(tag);
    JobSpec fp32 = TinyJob();
    fp32.optimizer_mode = mode;
    fp32.checkpoint_root = root + "/fp32-" + tag;
    JobSpec spec = fp32;
    spec.optimizer.bf16_moments = true;
    spec.checkpoint_root = root + "/bf16-" + tag;
    auto straight = Train(spec, data, 3);
    JobSpec resumed = spec;
    resumed.resume_from = spec.checkpoint_root + "/step-3";
    resumed.checkpoint_root = spec.checkpoint_root + "-resumed";
    EXPECT_TRUE(SameWeights(straight, Train(resumed, {data.begin() + 3, data.end()})));
    auto reference = Train(fp32, data, 3);
    bool differs = false;  // the moments really are bf16: the training is not the fp32 one
    for (const auto& [name, t] : straight) differs = differs || !at::equal(t, reference.at(name));
    EXPECT_TRUE(differs);
    const auto half = std::filesystem::file_size(spec.checkpoint_root + "/step-3/optimizer.safetensors");
    const auto full = std::filesystem::file_size(fp32.checkpoint_root + "/step-3/optimizer.safetensors");
    EXPECT_LT(static_cast<double>(half), 0.6 * static_cast<double>(full)) << half << " vs " << full;
  }
  std::filesystem::remove_all(root);
}

// SGD (momentum, Nesterov), Lion and Adafactor through the engine: each trains differently from
// AdamW, its checkpoint holds its state (SGD and Lion one buffer per parameter; Adafactor the
// factored row and column variances of each matrix, the full variance of each vector), and a
// resumed run ends bit-identical to the straight run, sync and async; a checkpoint of another
// optimizer's state is refused.
TEST(EngineCheckpoint, SgdLionAndAdafactorResumeBitIdentically) {
  const std::string root =
      (std::filesystem::temp_directory_path() / ("rp_sgd_lion_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 5; ++i) data.push_back(RandomTokens(4, 8, 41, 900 + i));
  JobSpec adamw = TinyJob();
  adamw.checkpoint_root = root + "/adamw";
  const auto reference = Train(adamw, data);
  for (auto algorithm :
       {spec::OptimizerAlgorithm::kSgd, spec::OptimizerAlgorithm::kLion, spec::OptimizerAlgorithm::kAdafactor}) {
    for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
      const std::string tag =
          std::string(spec::OptimizerName(algorithm)) + (mode == planning::OptimizerMode::kSync ? "-sync" : "-async");
      SCOPED_TRACE(tag);
      JobSpec spec = TinyJob();
      spec.optimizer.algorithm = algorithm;
      spec.optimizer_mode = mode;
      if (algorithm == spec::OptimizerAlgorithm::kSgd) {
        spec.optimizer.lr = 0.05;
        spec.optimizer.momentum = 0.9;
        spec.optimizer.nesterov = true;
      } else if (algorithm == spec::OptimizerAlgorithm::kLion) {
        spec.optimizer.beta2 = 0.99;
      } else {
        spec.optimizer.lr = 1e-2;
        spec.optimizer.weight_decay = 0.01;
      }
      spec.checkpoint_root = root + "/" + tag;
      auto straight = Train(spec, data, 2);
      bool differs = false;
      for (const auto& [name, t] : straight) differs = differs || !at::equal(t, reference.at(name));
      EXPECT_TRUE(differs) << "trains like AdamW";
      auto state = workers::io::SafetensorsFile::Open(spec.checkpoint_root + "/step-2/optimizer.safetensors");
      ASSERT_TRUE(state.ok()) << state.status();
      if (algorithm != spec::OptimizerAlgorithm::kAdafactor) {
        for (const auto& t : (*state)->tensors()) EXPECT_EQ(t.name.rfind("m.", 0), 0u) << t.name;  // one buffer
      } else {
        // A matrix [r, c] keeps m [r, 1] and v [1, c]; a vector its full variance in v.
        auto weights = workers::io::SafetensorsFile::Open(spec.checkpoint_root + "/step-2/weights.safetensors");
        ASSERT_TRUE(weights.ok());
        int matrices = 0;
        for (const auto& w : (*weights)->tensors()) {
          const auto* m = (*state)->Find("m." + w.name);
          const auto* v = (*state)->Find("v." + w.name);
          ASSERT_NE(v, nullptr) << w.name;
          if (w.shape.size() >= 2) {
            ++matrices;
            ASSERT_NE(m, nullptr) << w.name;
            EXPECT_EQ(m->shape, (std::vector<int64_t>{w.shape[0], 1})) << w.name;
            EXPECT_EQ(v->shape, (std::vector<int64_t>{1, w.shape[1]})) << w.name;
          } else {
            EXPECT_EQ(m, nullptr) << w.name;
            EXPECT_EQ(v->shape, w.shape) << w.name;
          }
        }
        EXPECT_GT(matrices, 5);
      }
      EXPECT_FALSE((*state)->tensors().empty());
      JobSpec resumed = spec;
      resumed.resume_from = spec.checkpoint_root + "/step-2";
      resumed.checkpoint_root = spec.checkpoint_root + "-resumed";
      EXPECT_TRUE(SameWeights(straight, Train(resumed, {data.begin() + 2, data.end()})));
      // Another optimizer's state is not this one's.
      auto engine = Engine::Create({"cpu:2"});
      JobSpec wrong = TinyJob();
      wrong.resume_from = resumed.resume_from;
      auto id = (*engine)->Submit(wrong);
      ASSERT_FALSE(id.ok());
      EXPECT_NE(id.status().message().find("optimizer is adamw"), std::string::npos) << id.status();
    }
  }
  std::filesystem::remove_all(root);
}

// A LoRA checkpoint holds the adapters and their moments, and describes the base instead of
// storing it: resuming from it ends bit-identical to the straight run (the base comes from the
// job's own source, checked against the record); a job on another base is refused, naming the
// tensor, before anything is loaded. After the job ended its base parameters are still readable
// (from the rebuilt seeded base, checked against the record).
TEST(EngineCheckpoint, LoraCheckpointsHoldOnlyTheAdaptersAndRefuseAnotherBase) {
  const std::string root =
      (std::filesystem::temp_directory_path() / ("rp_lora_ckpt_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(root);
  std::vector<at::Tensor> data;
  for (int i = 0; i < 5; ++i) data.push_back(RandomTokens(4, 8, 41, 700 + i));
  JobSpec spec = TinyJob();
  spec.model.lora.rank = 2;
  spec.precision = Precision::kBFloat16;  // the base lives in bf16 master copies
  spec.optimizer_mode = planning::OptimizerMode::kAsync;
  spec.checkpoint_root = root + "/straight";
  auto straight = Train(spec, data, 2);
  const std::string ckpt = spec.checkpoint_root + "/step-2";
  // Only the adapters' fp32 weights: a fraction of what the whole model in fp32 would be.
  auto weights = workers::io::SafetensorsFile::Open(ckpt + "/weights.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  int64_t adapter_params = 0;
  for (const auto& t : (*weights)->tensors()) {
    EXPECT_NE(t.name.find(".lora_"), std::string::npos) << t.name << " is not an adapter";
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    adapter_params += n;
  }
  EXPECT_EQ(adapter_params, spec.model.LoraParams());
  auto meta = workers::io::VerifyCheckpoint(ckpt);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->base_fingerprint.size(), 8u);
  auto base = workers::io::ReadCheckpointBase(ckpt);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->fingerprint, meta->base_fingerprint);
  EXPECT_GT(base->tensors.size(), 10u);
  // Resumed: bit-identical, base parameters included (read after the job from the rebuilt base).
  JobSpec resumed = spec;
  resumed.resume_from = ckpt;
  resumed.checkpoint_root = root + "/resumed";
  EXPECT_TRUE(SameWeights(straight, Train(resumed, {data.begin() + 2, data.end()})));
  // Another base (another seed initialises it differently): the job fails naming a base tensor.
  auto engine = Engine::Create({"cpu:2"});
  JobSpec other = resumed;
  other.seed = spec.seed + 1;
  other.checkpoint_root = root + "/other";
  auto id = (*engine)->Submit(other);
  ASSERT_TRUE(id.ok()) << id.status();
  const auto events = DrainUntilEnded(**engine, *id);
  EXPECT_EQ(*(*engine)->State(*id), JobState::kFailed);
  std::string why;
  for (const auto& e : events) {
    if (e.kind == JobEvent::Kind::kState && e.state == JobState::kFailed) why = e.message;
  }
  EXPECT_NE(why.find("base tensor model.embed_tokens.weight has other values"), std::string::npos) << why;
  // The same base in another precision is another base too (the fingerprint is over the bytes
  // the workers upload), and is told so.
  JobSpec fp32 = resumed;
  fp32.precision = Precision::kFloat32;
  fp32.checkpoint_root = root + "/fp32";
  id = (*engine)->Submit(fp32);
  ASSERT_TRUE(id.ok()) << id.status();
  why.clear();
  for (const auto& e : DrainUntilEnded(**engine, *id)) {
    if (e.kind == JobEvent::Kind::kState && e.state == JobState::kFailed) why = e.message;
  }
  EXPECT_NE(why.find("was BF16, this job's is F32"), std::string::npos) << why;
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace rp::scheduler
