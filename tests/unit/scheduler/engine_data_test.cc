// The engine's data: a queued job is not built until it runs, bounded asynchronous feeds,
// token-file, JSONL and prepared-chat jobs read by the runner like the reference.
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
#include "scheduler/planning/presets.h"
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

int64_t SelfRssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// A queued job costs no host memory: Submit validates and returns; the store is built when the
// runner takes the job. A Qwen3-32B job (about 650 GB of host state in fp32) is admitted behind a
// running job and cancelled before it starts: it never exists in memory.
TEST(Engine, AQueuedJobIsNotBuiltUntilItRuns) {
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  JobSpec small = TinyJob();
  auto running = (*engine)->Submit(small);
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE((*engine)->FeedBatch(*running, rp::testing::ToBatch(RandomTokens(4, 8, small.model.vocab, 1))).ok());
  ASSERT_TRUE(AwaitState(**engine, *running, JobState::kRunning));
  JobSpec big;
  big.name = "big";
  big.model = *planning::ModelPreset("qwen3-32b");
  big.model.lora.rank = 0;
  big.precision = Precision::kBFloat16;
  const int64_t before = SelfRssKiB();
  auto queued = (*engine)->Submit(big);
  ASSERT_TRUE(queued.ok()) << queued.status();
  const int64_t after = SelfRssKiB();
  EXPECT_LT(after - before, 64 * 1024) << "Submit allocated " << (after - before) << " KiB";
  EXPECT_EQ(*(*engine)->State(*queued), JobState::kQueued);
  // Nothing to read yet, but its shapes are known (export planning needs no store).
  EXPECT_EQ((*engine)->Parameter(*queued, "model.norm.weight").status().code(), absl::StatusCode::kFailedPrecondition);
  auto shapes = (*engine)->ParameterShapes(*queued);
  ASSERT_TRUE(shapes.ok());
  EXPECT_EQ(shapes->size(), 2u + 64 * 11 + 1);  // embed + norm + 64 blocks x 11 + lm_head
  ASSERT_TRUE((*engine)->Cancel(*queued).ok());
  EXPECT_EQ(*(*engine)->State(*queued), JobState::kCancelled);
  ASSERT_TRUE((*engine)->CloseInput(*running).ok());
  DrainUntilEnded(**engine, *running);
  EXPECT_EQ(*(*engine)->State(*running), JobState::kSucceeded);
  EXPECT_LT(SelfRssKiB() - before, 64 * 1024);
}

// Many feeders into one job: the queue and the waiting room together never hold more than
// 2 x max_queued_batches, whatever the number of callers; every accepted feed completes exactly
// once (queued, then trained), the rest are told to retry; loading is reported as progress.
TEST(Engine, AsyncFeedsAreBoundedPerJobAcrossAllCallers) {
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  JobSpec spec = TinyJob();
  spec.max_queued_batches = 3;
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*engine)->Pause(*id).ok());  // held back: nothing drains the queue yet
  std::atomic<int> completed_ok{0}, completed_other{0}, refused{0}, accepted{0};
  std::vector<std::thread> feeders;
  for (int t = 0; t < 16; ++t) {
    feeders.emplace_back([&, t] {
      absl::Status st =
          (*engine)->FeedBatchAsync(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 200 + t)),
                                    [&](absl::Status done) { (done.ok() ? completed_ok : completed_other)++; });
      if (st.ok()) {
        ++accepted;
      } else {
        EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
        ++refused;
      }
    });
  }
  for (auto& f : feeders) f.join();
  EXPECT_EQ(accepted.load(), 2 * spec.max_queued_batches);
  EXPECT_EQ(refused.load(), 16 - 2 * spec.max_queued_batches);
  EXPECT_EQ((*engine)->Info(*id)->queued_batches, 2 * spec.max_queued_batches);
  EXPECT_EQ(completed_ok.load(), spec.max_queued_batches) << "the first ones are queued at once";
  // A synchronous feed waits behind the waiting room, then times out.
  EXPECT_EQ((*engine)->FeedBatch(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 1)), 20ms).code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE((*engine)->Resume(*id).ok());
  for (int i = 0; i < 500 && completed_ok.load() < accepted.load(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(completed_ok.load(), accepted.load());
  ASSERT_TRUE((*engine)->CloseInput(*id).ok());
  auto events = DrainUntilEnded(**engine, *id);
  EXPECT_EQ(completed_other.load(), 0);
  int iterations = 0, progress = 0;
  for (const auto& e : events) {
    iterations += e.kind == JobEvent::Kind::kIteration;
    if (e.kind == JobEvent::Kind::kProgress) {
      ++progress;
      EXPECT_EQ(iterations, 0) << "progress is reported while loading, before training";
    }
  }
  EXPECT_EQ(iterations, accepted.load());
  EXPECT_GE(progress, 1);
  EXPECT_EQ((*engine)->Info(*id)->steps_done, accepted.load());
}

// A job that ends with feeds still waiting tells each of them so, once.
TEST(Engine, WaitingFeedsOfACancelledJobCompleteWithAnError) {
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  JobSpec spec = TinyJob();
  spec.max_queued_batches = 1;
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE((*engine)->Pause(*id).ok());
  std::atomic<int> ok{0}, failed{0};
  auto done = [&](absl::Status st) { (st.ok() ? ok : failed)++; };
  ASSERT_TRUE((*engine)->FeedBatchAsync(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 1)), done).ok());
  ASSERT_TRUE((*engine)->FeedBatchAsync(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 2)), done).ok());
  EXPECT_EQ(ok.load(), 1);
  ASSERT_TRUE((*engine)->Cancel(*id).ok());
  // A job the runner already built (paused) ends on the runner, which then answers its waiting
  // feeds; one that never started ends inside Cancel. Either way, once it has ended:
  DrainUntilEnded(**engine, *id);
  EXPECT_EQ(*(*engine)->State(*id), JobState::kCancelled);
  EXPECT_EQ(failed.load(), 1);
  EXPECT_EQ((*engine)->FeedBatchAsync(*id, rp::testing::ToBatch(RandomTokens(4, 8, spec.model.vocab, 3)), done).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ok.load() + failed.load(), 2);
}

// A token-file job is read by the runner itself: no feeding, FeedBatch refused, every batch of
// every epoch trained in order, and the job equals the same batches streamed.
TEST(Engine, TokenFileJobsAreReadByTheRunner) {
  const std::string path = ::testing::TempDir() + "/engine_tokens_" + std::to_string(getpid()) + ".bin";
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 4 * 8 * 3 + 1; ++i) {  // three batches of 4 x 8 (+1 for the last target)
      const uint16_t t = static_cast<uint16_t>((i * 7) % 41);
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  JobSpec spec = TinyJob();
  spec.token_file = TokenFileSource{path, TokenFileSource::Format::kBinUint16, 4, 8, 2};
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ((*engine)->FeedBatch(*id, rp::testing::ToBatch(RandomTokens(4, 8, 41, 1))).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*engine)->Info(*id)->total_steps, 6);
  auto events = DrainUntilEnded(**engine, *id);
  EXPECT_EQ(*(*engine)->State(*id), JobState::kSucceeded);
  std::vector<double> file_losses;
  for (const auto& e : events) {
    if (e.kind == JobEvent::Kind::kIteration) file_losses.push_back(e.stats.loss);
  }
  ASSERT_EQ(file_losses.size(), 6u);  // 3 batches x 2 epochs
  EXPECT_EQ((*engine)->Info(*id)->batches_consumed, 6);
  // The same windows streamed: tokens[i..i+8), labels shifted by one.
  JobSpec streamed = TinyJob();
  auto sid = (*engine)->Submit(streamed);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int b = 0; b < 3; ++b) {
      Batch batch;
      batch.rows = 4;
      batch.cols = 8;
      for (int r = 0; r < 4; ++r) {
        for (int c = 0; c < 8; ++c) {
          const int i = (b * 4 + r) * 8 + c;
          batch.tokens.push_back((i * 7) % 41);
          batch.labels.push_back(((i + 1) * 7) % 41);
        }
      }
      ASSERT_TRUE((*engine)->FeedBatch(*sid, batch).ok());
    }
  }
  ASSERT_TRUE((*engine)->CloseInput(*sid).ok());
  std::vector<double> stream_losses;
  for (const auto& e : DrainUntilEnded(**engine, *sid)) {
    if (e.kind == JobEvent::Kind::kIteration) stream_losses.push_back(e.stats.loss);
  }
  EXPECT_EQ(stream_losses, file_losses);
  std::remove(path.c_str());
}

// Runs `spec` (a data-file job) and expects its per-step losses to equal the plain LibTorch
// reference on windows of `tokens` in file order, with targets masked where `trained` is 0.
void ExpectTrainsLikeTheReference(Engine& engine, const JobSpec& spec, const std::vector<int64_t>& tokens,
                                  const std::vector<int>& trained) {
  const int64_t B = spec.token_file->global_batch, S = spec.token_file->sequence_length;
  auto id = engine.Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<double> got;
  for (const auto& e : DrainUntilEnded(engine, *id)) {
    if (e.kind == JobEvent::Kind::kIteration) got.push_back(e.stats.loss);
  }
  ASSERT_EQ(*engine.State(*id), JobState::kSucceeded) << engine.Info(*id)->message;
  const int64_t batches = (static_cast<int64_t>(tokens.size()) - 1) / S / B;
  ASSERT_EQ(static_cast<int64_t>(got.size()), batches);
  ASSERT_GE(batches, 5);
  workers::HostModelStore init(spec.model, at::kFloat, spec.seed);
  rp::testing::ReferenceModel ref(init, runtime::ToAdamW(spec.optimizer));
  int64_t masked = 0;
  for (int64_t b = 0; b < batches; ++b) {
    at::Tensor t = at::empty({B, S}, at::kLong), l = at::empty({B, S}, at::kLong);
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t c = 0; c < S; ++c) {
        const int64_t i = (b * B + r) * S + c;
        t[r][c] = tokens[i];
        l[r][c] = trained[i + 1] ? tokens[i + 1] : -100;
        masked += trained[i + 1] ? 0 : 1;
      }
    }
    const double want = ref.Step(t, l);
    EXPECT_NEAR(got[b], want, 1e-5 * want) << "step " << b;
  }
  EXPECT_GT(masked, batches * B * S / 5);  // the masks really mask
}

// The oracle's directory (made once for every test process; read only) and its expected.json.
nlohmann::json MakeFixture(const std::string& script, std::string* dir, const std::string& args = "",
                           const std::vector<std::string>& key_files = {}) {
  auto made = rp::testing::CachedOracle(RP_VENV_PYTHON, RP_TEST_DIR "/" + script, args, key_files);
  EXPECT_TRUE(made.ok()) << made.status();
  *dir = made.ok() ? *made : std::string("/nonexistent");
  return nlohmann::json::parse(rp::testing::ReadWholeFile(*dir + "/expected.json"), nullptr, false);
}

// A JSONL prompt/completion dataset read and tokenized by the runner trains exactly like the plain
// LibTorch reference on the tokens and masks PyPI `tokenizers` gives (make_jsonl_dataset.py).
TEST(Engine, JsonlJobTrainsLikeTheReferenceOnTheSameTokensAndMasks) {
  std::string dir;
  const auto expected = MakeFixture("make_jsonl_dataset.py", &dir);
  ASSERT_FALSE(expected.is_discarded());
  JobSpec spec = TinyJob();
  spec.model.vocab = expected["vocab"].get<int>();
  spec.token_file = TokenFileSource{dir + "/train.jsonl", TokenFileSource::Format::kAuto, 4, 16, 1};
  spec.token_file->tokenizer_dir = dir + "/tok";
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  ExpectTrainsLikeTheReference(**engine, spec, expected["tokens"].get<std::vector<int64_t>>(),
                               expected["trained"].get<std::vector<int>>());
  // A dataset the tokenizer cannot cover is refused at Submit, naming the vocabularies.
  JobSpec small = spec;
  small.model.vocab = 100;
  auto refused = (*engine)->Submit(small);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(std::string(refused.status().message()).find("but the model's vocabulary is 100"), std::string::npos)
      << refused.status();
  JobSpec no_tokenizer = spec;
  no_tokenizer.token_file->tokenizer_dir.clear();
  EXPECT_NE(std::string((*engine)->Submit(no_tokenizer).status().message()).find("needs a tokenizer"),
            std::string::npos);
}

// Chat rendered by `roundpipe_client.py prepare` with the model's chat template trains on the
// assistant turns only, exactly like the reference on transformers' tokens and assistant mask.
TEST(Engine, PreparedChatTrainsLikeTheReferenceOnTheAssistantTurns) {
  std::string dir;
  const auto expected =
      MakeFixture("make_chat_dataset.py", &dir, " " RP_CLIENT_PY_DIR, {RP_CLIENT_PY_DIR "/roundpipe_prepare.py"});
  ASSERT_FALSE(expected.is_discarded());
  JobSpec spec = TinyJob();
  spec.model.vocab = expected["vocab"].get<int>();
  spec.token_file = TokenFileSource{dir + "/markers.safetensors", TokenFileSource::Format::kAuto, 4, 16, 1};
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  ExpectTrainsLikeTheReference(**engine, spec, expected["tokens"].get<std::vector<int64_t>>(),
                               expected["trained"].get<std::vector<int>>());
}

}  // namespace
}  // namespace rp::scheduler
