// Engine::Generate: completions from a checkpoint's weights, loaded on demand, freed after,
// never listed, beside a running job however many may run, and stopped by its caller.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/support/temp_dir.h"
#include "tests/unit/scheduler/engine_test_jobs.h"

namespace rp::scheduler {
namespace {

// A byte-level model (vocab 300) trained on a repeating byte pattern from a token file.
JobSpec ByteJob(const std::string& dir) {
  JobSpec s = TinyJob();
  s.model.vocab = 300;
  s.optimizer.lr = 1e-2;
  const std::string path = dir + "/train.bin";
  std::ofstream out(path, std::ios::binary);
  const std::string text = "the cat sat on the mat. ";
  for (int i = 0; i < 4 * 16 * 8 + 1; ++i) {
    const uint16_t t = static_cast<unsigned char>(text[static_cast<size_t>(i) % text.size()]);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
  s.token_file = TokenFileSource{path, TokenFileSource::Format::kBinUint16, 4, 16, 1};
  s.checkpoint_root = dir + "/checkpoints";
  return s;
}

EvalPolicy::Samples Prompts() {
  EvalPolicy::Samples s;
  s.prompts = {"the cat", "on the m", "x"};
  s.max_new_tokens = 6;
  return s;
}

// The final evaluation's samples come from the final weights in the job's own controller; a
// generation loads the final checkpoint into a fresh store and controller: the same ids.
TEST(EngineGenerate, FromTheFinalCheckpointEqualsTheJobsOwnFinalSamples) {
  const std::string dir = rp::testing::FreshTempDir("engine_generate", "final").string();
  JobSpec spec = ByteJob(dir);
  spec.validation = TokenFileSource{spec.token_file->path, TokenFileSource::Format::kBinUint16, 4, 16, 1};
  spec.eval.samples = Prompts();
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<GeneratedSample> want;
  for (const JobEvent& e : DrainUntilEnded(**engine, *id)) {
    if (e.kind == JobEvent::Kind::kEval) want = e.eval.samples;
  }
  ASSERT_EQ(*(*engine)->State(*id), JobState::kSucceeded);
  ASSERT_EQ(want.size(), 3u);
  auto info = (*engine)->Info(*id);
  ASSERT_TRUE(info.ok());
  const EngineStats before = (*engine)->Stats();

  JobSpec from = spec;
  from.resume_from = dir + "/checkpoints/step-8";
  ASSERT_TRUE(std::filesystem::exists(from.resume_from));
  auto got = (*engine)->Generate(from, Prompts());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 3u);
  bool any_differs_from_untrained = false;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*got)[i].prompt, want[i].prompt);
    EXPECT_EQ((*got)[i].token_ids, want[i].token_ids) << "prompt " << i;
    EXPECT_EQ((*got)[i].completion, want[i].completion);
  }
  // The weights matter: the untrained model (no resume_from) completes differently.
  JobSpec untrained = spec;
  auto fresh = (*engine)->Generate(untrained, Prompts());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  for (size_t i = 0; i < 3; ++i) any_differs_from_untrained |= (*fresh)[i].token_ids != want[i].token_ids;
  EXPECT_TRUE(any_differs_from_untrained);

  // Never listed, and nothing of it is held after.
  const EngineStats after = (*engine)->Stats();
  EXPECT_EQ(after.jobs_total, before.jobs_total);
  EXPECT_EQ(after.jobs_active, 0);
  EXPECT_EQ(after.host_model_bytes, 0);
  EXPECT_EQ(after.host_optimizer_bytes, 0);
}

// A generation does not wait for a running slot: with one slot, taken by a streamed job that
// waits for batches, it still answers; a bad request is refused naming the field.
TEST(EngineGenerate, RunsBesideARunningJobAndRefusesBadRequests) {
  const std::string dir = rp::testing::FreshTempDir("engine_generate", "beside").string();
  JobSpec spec = ByteJob(dir);
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  JobSpec streamed = TinyJob();
  auto busy = (*engine)->Submit(streamed);
  ASSERT_TRUE(busy.ok());
  ASSERT_TRUE(AwaitState(**engine, *busy, JobState::kRunning));
  auto got = (*engine)->Generate(spec, Prompts());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 3u);
  EXPECT_EQ(*(*engine)->State(*busy), JobState::kRunning);

  EvalPolicy::Samples bad = Prompts();
  bad.max_new_tokens = 0;
  auto refused = (*engine)->Generate(spec, bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("max_new_tokens"), std::string::npos) << refused.status();
  EXPECT_EQ((*engine)->Generate(spec, EvalPolicy::Samples{}).status().code(), absl::StatusCode::kInvalidArgument);
  JobSpec small = spec;
  small.model.vocab = 41;  // byte-level prompts need 256 ids
  EXPECT_EQ((*engine)->Generate(small, Prompts()).status().code(), absl::StatusCode::kInvalidArgument);
  JobSpec missing = spec;
  missing.resume_from = dir + "/no-such-checkpoint";
  EXPECT_FALSE((*engine)->Generate(missing, Prompts()).ok());
  ASSERT_TRUE((*engine)->Cancel(*busy).ok());
}

// The caller's stop ends a long generation with its status, and the engine holds nothing after;
// a shutdown during one ends it too (and waits for it).
TEST(EngineGenerate, TheCallersStopAndAShutdownEndIt) {
  const std::string dir = rp::testing::FreshTempDir("engine_generate", "stop").string();
  JobSpec spec = ByteJob(dir);
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  EvalPolicy::Samples many = Prompts();
  many.max_new_tokens = 1024;
  std::atomic<int> polls{0};
  const auto t0 = std::chrono::steady_clock::now();
  auto stopped = (*engine)->Generate(
      spec, many, [&]() -> absl::Status { return ++polls >= 5 ? absl::CancelledError("enough") : absl::OkStatus(); });
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
  EXPECT_EQ(stopped.status().message(), "enough");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  EXPECT_EQ((*engine)->Stats().host_model_bytes, 0);

  absl::StatusOr<std::vector<GeneratedSample>> during_shutdown;
  std::thread t([&] { during_shutdown = (*engine)->Generate(spec, many); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  (*engine)->Shutdown();  // returns once the generation ended
  t.join();
  EXPECT_FALSE(during_shutdown.ok());
  EXPECT_TRUE(absl::IsCancelled(during_shutdown.status()) || absl::IsUnavailable(during_shutdown.status()))
      << during_shutdown.status();
}

}  // namespace
}  // namespace rp::scheduler
