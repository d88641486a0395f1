// The daemon under faults and hostile requests: checkpoints failing on a full disk, fp16
// divergence, absurd spec values, a truncated or garbage job store, an oversized job id, a drain
// with a user-paused job, many concurrent streams into one job. Every test failed against the
// daemon before its fix.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include "absl/strings/str_cat.h"
#include "tests/integration/fixtures.h"
#include "tests/support/npy_bytes.h"

#include "tests/integration/hardening_fixture.h"

namespace rp::testing {
namespace {

using namespace std::chrono_literals;

// 8. A full disk: every policy checkpoint after the first failed silently and the job SUCCEEDED
//    far behind. Now each failure is an event, a log line, a metric and the job's message, and
//    after 3 in a row the job pauses (resumable once there is room).
TEST_F(HardeningTest, CheckpointFailuresAreReportedAndPauseTheJob) {
  const std::string out = root_ + "/data/small";
  fs::create_directories(out);
  // A really full disk: a 64 KiB tmpfs (the test command runs as root, as CI does).
  ASSERT_EQ(mount("tmpfs", out.c_str(), "tmpfs", 0, "size=64k"), 0)
      << "mounting a 64 KiB tmpfs at " << out << " failed (" << std::strerror(errno)
      << "): the full-disk test needs root or CAP_SYS_ADMIN";
  struct Unmount {  // also when an assertion below ends the test early
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{out};
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.set_output_dir(out);
  spec.mutable_checkpoint()->set_every_steps(1);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  v1::Batch first = TinyBatch(job->id(), 1, /*keep_open=*/true);
  std::vector<v1::Batch> batches = {first};
  for (int i = 1; i < 5; ++i) batches.push_back(TinyBatch("", static_cast<uint32_t>(10 + i)));
  ASSERT_TRUE(c->StreamBatches(job->id(), batches).ok());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_PAUSED)) << daemon_.Output();
  auto rec = c->Get(job->id());
  ASSERT_TRUE(rec.ok());
  EXPECT_NE(rec->message().find("checkpoints in a row failed"), std::string::npos) << rec->message();
  EXPECT_NE(rec->message().find("No space left"), std::string::npos) << rec->message();
  const std::string metrics = HttpGet(daemon_.metrics_address(), "/metrics");
  EXPECT_GE(MetricValue(metrics, "roundpipe_checkpoint_failures_total"), 3) << metrics;
  EXPECT_NE(daemon_.Output().find("failed"), std::string::npos);
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  daemon_.Stop(9);
}

// 9. fp16 divergence: every step skipped with a NaN loss and the scale backing off forever; the
//    job SUCCEEDED with a non-finite export. Now it fails naming the step; so does a non-finite
//    loss in fp32.
TEST_F(HardeningTest, DivergenceFailsTheJob) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  const std::string base = BaseModel(*c);
  ASSERT_FALSE(base.empty());
  // Poison the weights: every byte of the file's data section becomes 0xFF (NaN in F32).
  {
    std::fstream f(base + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    f.seekg(0, std::ios::end);
    const int64_t size = f.tellg();
    f.seekp(static_cast<std::streamoff>(8 + n));
    f << std::string(static_cast<size_t>(size - 8 - static_cast<int64_t>(n)), '\xff');
  }
  for (v1::Precision p : {v1::PRECISION_FP16, v1::PRECISION_FP32}) {
    v1::JobSpec spec = HfSpec(base);
    spec.set_precision(p);
    auto job = c->Submit(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    Watcher w(*c, job->id());
    v1::Batch first = TinyBatch(job->id(), 1, /*keep_open=*/true);
    std::vector<v1::Batch> batches = {first};
    for (int i = 1; i < 40; ++i) batches.push_back(TinyBatch("", static_cast<uint32_t>(i)));
    (void)c->StreamBatches(job->id(), batches);  // may end early: the job fails meanwhile
    ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_FAILED)) << v1::Precision_Name(p);
    auto rec = c->Get(job->id());
    ASSERT_TRUE(rec.ok());
    EXPECT_NE(rec->error().find("diverged"), std::string::npos) << rec->error();
  }
}

// 8 + 9. Non-finite or absurd spec values: lr NaN silently became 1e-4, inf/NaN elsewhere failed
//    later with a misleading message or trained nothing, a 1e9 global batch waited forever, a
//    config.json with 2^32+4 layers became 4, a 2^57 vocab overflowed the host estimate into
//    UNIMPLEMENTED with no message. Now each is INVALID_ARGUMENT naming the field.
TEST_F(HardeningTest, NonFiniteAndAbsurdSpecValuesAreRefusedNamingTheField) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  const double nan = std::nan(""), inf = HUGE_VAL;
  struct Case {
    std::string needle;
    std::function<void(v1::JobSpec&)> mutate;
  };
  const std::vector<Case> cases = {
      {"optimizer.lr", [&](auto& s) { s.mutable_optimizer()->set_lr(nan); }},
      {"optimizer.lr", [&](auto& s) { s.mutable_optimizer()->set_lr(inf); }},
      {"optimizer.weight_decay", [&](auto& s) { s.mutable_optimizer()->set_weight_decay(nan); }},
      {"optimizer.eps", [&](auto& s) { s.mutable_optimizer()->set_eps(inf); }},
      {"min_lr_ratio", [&](auto& s) { s.mutable_optimizer()->mutable_lr_schedule()->set_min_lr_ratio(nan); }},
      {"model.rms_eps", [&](auto& s) { s.mutable_model()->set_rms_eps(inf); }},
      {"model.rope_theta", [&](auto& s) { s.mutable_model()->set_rope_theta(inf); }},
      {"model.rope_scaling_factor", [&](auto& s) { s.mutable_model()->set_rope_scaling_factor(nan); }},
      {"model.lora.alpha",
       [&](auto& s) {
         s.mutable_model()->mutable_lora()->set_rank(4);
         s.mutable_model()->mutable_lora()->set_alpha(nan);
       }},
      {"global_batch", [&](auto& s) { s.mutable_batching()->set_global_batch(1000000000); }},
      {"vocab", [&](auto& s) { s.mutable_model()->set_vocab(int64_t{1} << 57); }},
  };
  for (const Case& k : cases) {
    v1::JobSpec spec = TinySpec();
    k.mutate(spec);
    auto r = c->Submit(spec);
    ASSERT_FALSE(r.ok()) << k.needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k.needle << ": " << r.status();
    EXPECT_NE(r.status().message().find(k.needle), std::string::npos) << r.status();
  }
  const std::string dir = root_ + "/data/layers";
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json")
      << R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 4294967300, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16})";
  auto r = c->Submit(HfSpec(dir));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("num_hidden_layers"), std::string::npos) << r.status();
}

// 10. A truncated (0-byte) jobs.sqlite: ids restarted at job-000001 and collided with the old
//     jobs' output dirs. Now ids continue after the directories that exist, and it is logged.
TEST_F(HardeningTest, ATruncatedJobStoreNeverReusesIds) {
  ASSERT_TRUE(StartDaemon());
  const std::string first = SubmitOneThenStop(/*cancel=*/true, 15);
  ASSERT_FALSE(first.empty());
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string p = root_ + "/state/jobs.sqlite" + suffix;
    if (fs::exists(p)) fs::resize_file(p, 0);
  }
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto c = daemon_.Connect();
  auto b = c->Submit(TinySpec());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->id(), first);
  EXPECT_NE(daemon_.Output().find("damaged or replaced"), std::string::npos);
}

// 10b. A job store that is no database at all (overwritten) moved aside, the daemon starts.
TEST_F(HardeningTest, AGarbageJobStoreIsMovedAsideNotACrashLoop) {
  ASSERT_TRUE(StartDaemon());
  const std::string first = SubmitOneThenStop(/*cancel=*/false, 9);
  ASSERT_FALSE(first.empty());
  for (const char* suffix : {"-wal", "-shm"}) fs::remove(root_ + "/state/jobs.sqlite" + suffix);
  std::ofstream(root_ + "/state/jobs.sqlite", std::ios::trunc) << std::string(8192, 'G');
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  EXPECT_NE(daemon_.Output().find("moved it to"), std::string::npos);
  auto c = daemon_.Connect();
  auto b = c->Submit(TinySpec());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->id(), first);
  bool kept = false;
  for (const auto& e : fs::directory_iterator(root_ + "/state")) {
    kept |= e.path().filename().string().rfind("jobs.sqlite.damaged-", 0) == 0;
  }
  EXPECT_TRUE(kept);
}

// 11. A 100 KB job id echoed into the status made oversized trailers: RESOURCE_EXHAUSTED and a
//     bystander stream on the same channel aborted. Now the message is bounded.
TEST_F(HardeningTest, AnOversizedIdGetsABoundedErrorAndTheChannelSurvives) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  auto job = c->Submit(TinySpec());
  ASSERT_TRUE(job.ok());
  Watcher w(*c, job->id());
  ASSERT_TRUE(c->StreamBatches(job->id(), {TinyBatch(job->id(), 1, /*keep_open=*/true)}).ok());
  ASSERT_TRUE(w.WaitForSteps(1));
  const std::string huge(100000, 'j');
  auto r = c->Get(huge);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().code();
  EXPECT_LE(r.status().message().size(), 1100u);
  auto p = c->Pause(huge);
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
  // The bystander watch on the same channel still gets events.
  ASSERT_TRUE(c->StreamBatches(job->id(), {TinyBatch(job->id(), 2)}).ok());
  EXPECT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
}

// 13. A drain used to lose a running job its user had paused ("no usable checkpoint; submit it
//     again" after the restart). Now it is checkpointed, comes back PAUSED and resumes.
TEST_F(HardeningTest, ADrainKeepsAUserPausedJob) {
  ASSERT_TRUE(StartDaemon());
  std::string id;
  {
    auto c = daemon_.Connect();
    auto job = c->Submit(TinySpec());
    ASSERT_TRUE(job.ok());
    id = job->id();
    Watcher w(*c, id);
    std::vector<v1::Batch> two = {TinyBatch(id, 1, /*keep_open=*/true), TinyBatch("", 2)};
    ASSERT_TRUE(c->StreamBatches(id, two).ok());
    ASSERT_TRUE(w.WaitForSteps(2));
    ASSERT_TRUE(c->Pause(id).ok());
    ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_PAUSED));
    EXPECT_EQ(daemon_.Stop(15), 0);
  }
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto c = daemon_.Connect();
  auto rec = c->Get(id);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->last_checkpoint_step(), 2) << rec->message();
  EXPECT_EQ(rec->message().find("no usable checkpoint"), std::string::npos) << rec->message();
  Watcher w(*c, id);
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_PAUSED)) << rec->message();
  // Re-admitted paused (JobSpec::start_paused): the restarted daemon's log of state changes never
  // shows it RUNNING before its user resumes it (it used to, until a later Pause caught up).
  EXPECT_EQ(daemon_.Output().find(absl::StrCat("[", id, "] JOB_STATE_RUNNING")), std::string::npos) << daemon_.Output();
  ASSERT_TRUE(c->Resume(id).ok());
  ASSERT_TRUE(c->StreamBatches(id, {TinyBatch(id, 3)}).ok());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
  auto done = c->Get(id);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->progress().step(), 3);
}

// Many concurrent streams into one job: the job's queue plus its waiting room hold at most
// 2 x maxQueuedBatches batches over all streams (the bound is per job, not per stream); the
// streams beyond it are refused with RESOURCE_EXHAUSTED naming the limit, the ones waiting for
// room complete once the job runs, and every accepted batch is trained.
TEST_F(HardeningTest, ConcurrentStreamsIntoOneJobShareOneBound) {
  const std::string cfg = root_ + "/data/daemon.json";
  std::ofstream(cfg) << R"({"maxQueuedBatches": 2})";
  ASSERT_TRUE(StartDaemon({"--config", cfg}));
  auto c = daemon_.Connect();
  auto job = c->Submit(TinySpec());
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(c->Pause(job->id()).ok());  // nothing drains the queue meanwhile
  constexpr int kStreams = 12;
  std::vector<std::future<absl::StatusOr<v1::StreamSummary>>> streams;
  for (int s = 0; s < kStreams; ++s) {
    streams.push_back(std::async(std::launch::async, [&, s] {
      auto own = daemon_.Connect();
      return own->StreamBatches(job->id(), {TinyBatch(job->id(), 100 + s, /*keep_open=*/true)});
    }));
  }
  // Whatever fails below, cancelling the job releases the streams still waiting (the futures
  // join them when the test returns).
  struct CancelOnExit {
    client::Client* c;
    std::string id;
    ~CancelOnExit() { (void)c->Cancel(id); }
  } cancel_on_exit{c.get(), job->id()};
  // Refusals come back at once and 2 streams finish queued; 2 wait for room (they stay open).
  int refused = 0, ok = 0;
  std::vector<size_t> waiting;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (size_t s = 0; s < streams.size(); ++s) {
    if (streams[s].wait_until(deadline) != std::future_status::ready) {
      waiting.push_back(s);
      continue;
    }
    auto r = streams[s].get();
    if (r.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
      EXPECT_NE(r.status().message().find("waiting for room"), std::string::npos) << r.status();
      ++refused;
    }
  }
  ASSERT_EQ(ok, 2);
  ASSERT_EQ(refused, kStreams - 4);
  ASSERT_EQ(waiting.size(), 2u);
  Watcher w(*c, job->id());
  ASSERT_TRUE(c->Resume(job->id()).ok());
  for (size_t s : waiting) {
    ASSERT_EQ(streams[s].wait_for(std::chrono::seconds(60)), std::future_status::ready);
    auto r = streams[s].get();
    EXPECT_TRUE(r.ok()) << r.status();
  }
  ASSERT_TRUE(w.WaitForSteps(4));
  ASSERT_TRUE(c->StreamBatches(job->id(), {TinyBatch(job->id(), 7)}).ok());  // closes the input
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
  EXPECT_EQ(c->Get(job->id())->progress().step(), 5);
}

}  // namespace
}  // namespace rp::testing
