// The engine's host memory: a LoRA base in the job's dtype is mapped, not copied, and admission
// counts it as nothing.
#include "scheduler/engine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "nlohmann/json.hpp"
#include "scheduler/job_files.h"
#include "scheduler/planning/host_state.h"
#include "scheduler/planning/presets.h"
#include "scheduler/runtime/engine_impl.h"
#include "scheduler/runtime/model_adapter.h"
#include "tests/support/bf16_model_dir.h"
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

int64_t SelfStatusKiB(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  }
  return -1;
}

// Runs one iteration of a LoRA job on `dir` in `precision` and returns how much the process's
// anonymous memory (RssAnon) grew while the job holds its store, and the engine's stats then.
std::pair<int64_t, EngineStats> AnonGrowthOfALoraJob(const JobSpec& spec) {
  // Every block of 128 KiB or more comes from (and returns to) the kernel: the CPU workers'
  // stage copies, freed after each stage, do not linger in malloc's heap and count as the job's.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  auto engine = Engine::Create({"cpu:2"});
  EXPECT_TRUE(engine.ok());
  const int64_t before = SelfStatusKiB("RssAnon");
  auto id = (*engine)->Submit(spec);
  EXPECT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(RandomTokens(2, 16, spec.model.vocab, 9))).ok());
  bool trained = false;
  for (int i = 0; i < 600 && !trained; ++i) {
    auto events = (*engine)->AwaitEvents(*id, 100ms);  // named: the loop must not outlive a temporary
    for (const auto& e : *events) trained = trained || e.kind == JobEvent::Kind::kIteration;
  }
  EXPECT_TRUE(trained);
  const int64_t grown = (SelfStatusKiB("RssAnon") - before) * 1024;
  const EngineStats stats = (*engine)->Stats();
  EXPECT_TRUE((*engine)->Cancel(*id).ok());
  return {grown, stats};
}

// A LoRA job's frozen base is used where it lies in the model file when its dtype is the job's:
// the daemon's anonymous memory grows by far less than the base (the pages are the file's, which
// the kernel may drop), and the engine reports them as mapped. The same job in fp32 (the base
// must be converted) allocates its base: twice the file's size more.
TEST(EngineHostMemory, ALoraBaseInTheJobsDtypeIsMappedNotCopied) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("rp_mapped_base_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  JobSpec spec = TinyJob();
  spec.model.family = "llama";
  spec.model.qk_norm = false;
  spec.model.vocab = 32000;
  spec.model.hidden = 512;
  spec.model.intermediate = 1376;
  spec.model.num_blocks = 8;
  spec.model.num_heads = 8;
  spec.model.num_kv_heads = 4;
  spec.model.head_dim = 64;
  spec.model.lora.rank = 4;
  spec.precision = Precision::kBFloat16;
  spec.hf_dir = dir;
  const int64_t file = rp::testing::WriteBf16ModelDir(dir, spec.model);
  ASSERT_GT(file, int64_t{100} << 20);
  auto [mapped_growth, mapped_stats] = AnonGrowthOfALoraJob(spec);
  JobSpec fp32 = spec;
  fp32.precision = Precision::kFloat32;
  auto [copied_growth, copied_stats] = AnonGrowthOfALoraJob(fp32);
  std::printf("base file %.1f MiB: RssAnon +%.1f MiB mapped (bf16 job), +%.1f MiB copied (fp32 job)\n",
              static_cast<double>(file) / (1 << 20), static_cast<double>(mapped_growth) / (1 << 20),
              static_cast<double>(copied_growth) / (1 << 20));
  // The job's own working memory (stage copies on the CPU workers, activations, threads) is
  // there in both runs: about 30 MiB here, whatever the base's size.
  EXPECT_LT(mapped_growth, file / 2);
  EXPECT_GT(copied_growth - mapped_growth, file * 3 / 2);  // the fp32 base: twice the file
  EXPECT_EQ(mapped_stats.host_mapped_bytes, file);
  EXPECT_LT(mapped_stats.host_model_bytes, file / 10);
  EXPECT_EQ(copied_stats.host_mapped_bytes, 0);
  EXPECT_GT(copied_stats.host_model_bytes, file * 2 - (int64_t{1} << 20));
  std::filesystem::remove_all(dir);
}

// Admission counts a mapped base as nothing: a LoRA job on an 8B base stored in bf16 (a sparse
// file: the header is real, the data a hole) predicts the adapters' state alone in bf16, and
// the whole base converted to fp32 masters otherwise; the same function the store is checked
// against (model_adapter_test).
TEST(EngineHostMemory, AdmissionCountsAMappedBaseAsNothing) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("rp_sparse_8b_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  JobSpec spec;
  spec.model = *planning::ModelPreset("llama-3.1-8b");
  spec.model.lora.rank = 16;
  spec.precision = Precision::kBFloat16;
  spec.hf_dir = dir;
  const int64_t file = rp::testing::WriteBf16ModelDir(dir, spec.model, /*sparse=*/true);
  EXPECT_GT(file, int64_t{14} << 30);
  auto mapped = PredictHostStateBytes(spec);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_LT(*mapped, int64_t{1} << 30);
  EXPECT_EQ(*mapped, planning::HostStateBytes(spec.model, {.master_bytes = 2, .mapped_base = true}));
  spec.precision = Precision::kFloat32;
  auto copied = PredictHostStateBytes(spec);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_GT(*copied, 2 * file);
  // A directory without the weights is an error naming the file, not a guess.
  std::filesystem::remove(dir + "/model.safetensors");
  EXPECT_FALSE(PredictHostStateBytes(spec).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rp::scheduler
