// Hostile inputs to the server's parsers and spec rules (issue "harden the daemon"): crafted .npy
// headers, checkpoint meta.json files with fields of the wrong type, non-finite and absurd spec
// values, oversized status messages, /proc/meminfo parsing. Each case crashed, wrapped or was
// silently accepted before the fix.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "scheduler/planning/host_state.h"
#include "scheduler/runtime/token_dataset.h"
#include "server/config.h"
#include "server/host_memory.h"
#include "server/job_spec.h"
#include "server/status_util.h"
#include "tests/support/npy_bytes.h"
#include "tests/support/temp_dir.h"
#include "workers/files/npy_header.h"
#include "workers/io/checkpoint.h"
#include "workers/io/hf_config.h"

namespace rp::server {
namespace {
namespace fs = std::filesystem;
namespace v1 = roundpipe::v1;

fs::path TempDir(const std::string& name) { return rp::testing::FreshTempDir("hardening", name); }

std::string Npy(const std::string& descr, const std::string& shape, size_t payload_bytes) {
  return rp::testing::NpyBytes(descr, shape, std::string(payload_bytes, '\x01'));
}

absl::StatusOr<files::NpyLayout> Parse(const std::string& bytes) {
  return files::ParseNpyHeader(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

TEST(NpyHeader, ShapesThatOverflowAreRefusedNotWrapped) {
  // The product n * element size used to wrap and pass the size check (then the feeder read
  // past the mapping: SIGSEGV); a dimension beyond int64 threw out of std::stoll.
  for (const char* shape : {"(9223372036854775807,)", "(99999999999999999999999,)", "(4611686018427387904,)",
                            "(3037000500, 3037000500)", "(4294967296, 4294967297)"}) {
    auto r = Parse(Npy("<u2", shape, 64));
    ASSERT_FALSE(r.ok()) << shape;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << shape;
    EXPECT_NE(r.status().message().find("shape"), std::string::npos) << shape << ": " << r.status();
  }
  // 2^62 uint16 elements: the count fits int64, the byte size does not.
  auto r = Parse(Npy("<u2", "(4611686018427387903,)", 64));
  ASSERT_FALSE(r.ok());
  // A sane file still parses, and its payload is exactly accounted for.
  auto ok = Parse(Npy("<u2", "(32,)", 64));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->count, 32);
  EXPECT_EQ(ok->element_bytes, 2);
  EXPECT_FALSE(Parse(Npy("<u2", "(33,)", 64)).ok());
  EXPECT_FALSE(Parse(Npy("<u2", "(2, 2, 2)", 64)).ok());  // 3-d
  EXPECT_FALSE(Parse(Npy(">u2", "(32,)", 64)).ok());      // big-endian
  EXPECT_FALSE(Parse(Npy("<u2", "(-3,)", 64)).ok());
  // Truncated at every length: never a crash, always an error.
  const std::string good = Npy("<i8", "(4, 2)", 64);
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(Parse(good.substr(0, n)).ok()) << n;
}

TEST(NpyHeader, TheTokenDatasetRefusesAnOverflowingFile) {
  const fs::path d = TempDir("npy");
  std::ofstream(d / "evil.npy", std::ios::binary) << Npy("<u2", "(9223372036854775807,)", 4096);
  auto ds = scheduler::runtime::TokenDataset::Open((d / "evil.npy").string(), scheduler::TokenFileSource::Format::kAuto,
                                                   1, 8);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointMeta, FieldsOfTheWrongTypeAreDamageNotACrash) {
  // {"format": 1} made nlohmann's value() throw type_error out of recovery: exit 134 at every start.
  const fs::path d = TempDir("meta");
  const std::vector<std::string> metas = {
      R"({"format": 1})",
      R"({"format": "roundpipe-checkpoint-1", "step": "7", "partition": {"forward": [1], "fused": 1, "backward": [1]}})",
      R"({"format": "roundpipe-checkpoint-1", "step": 7, "batches_consumed": 7, "partition": {"forward": [1], "fused": "x", "backward": [1]}})",
      R"({"format": "roundpipe-checkpoint-1", "step": 7, "batches_consumed": 7, "partition": {"forward": [1e30], "fused": 1, "backward": [1]}})",
      R"({"format": "roundpipe-checkpoint-1", "step": 7, "batches_consumed": 7, "partition": {"forward": [-1], "fused": 1, "backward": [1]}})",
      R"({"format": "roundpipe-checkpoint-1", "step": 7, "batches_consumed": 7, "partition": 5})",
      R"([1, 2, 3])",
      R"({"format": ["roundpipe-checkpoint-1"]})",
  };
  for (size_t i = 0; i < metas.size(); ++i) {
    const fs::path dir = d / ("step-" + std::to_string(i));
    fs::create_directories(dir);
    std::ofstream(dir / "meta.json") << metas[i];
    auto m = workers::io::ReadCheckpointMeta(dir.string());
    ASSERT_FALSE(m.ok()) << metas[i];
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << metas[i] << ": " << m.status();
  }
  const fs::path good = d / "step-99";
  fs::create_directories(good);
  std::ofstream(good / "meta.json")
      << R"({"format": "roundpipe-checkpoint-1", "step": 7, "batches_consumed": 9, "loss_scale": 8.0, "partition": {"forward": [2], "fused": 3, "backward": [1]}, "note": 5})";
  auto m = workers::io::ReadCheckpointMeta(good.string());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step, 7);
  EXPECT_EQ(m->batches_consumed, 9);
  EXPECT_EQ(m->fused, 3);
  EXPECT_EQ(m->note, "");  // a note of the wrong type is dropped
}

TEST(HfConfig, SizesBeyondIntAndNonFiniteNumbersAreRefused) {
  const std::string base =
      R"("model_type": "llama", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2)";
  // 2^32 + 4 blocks used to be truncated to 4.
  for (const std::string& extra :
       {std::string(R"("num_hidden_layers": 4294967300)"), std::string(R"("num_hidden_layers": 18446744073709551615)"),
        std::string(R"("num_hidden_layers": 2, "rope_theta": 1e999)"),
        std::string(R"("num_hidden_layers": 2, "rms_norm_eps": 5)"), std::string(R"("num_hidden_layers": 2000000)"),
        std::string(R"("num_hidden_layers": 2, "hidden_act": 7)")}) {
    auto c = files::ParseHfConfig("{" + base + ", " + extra + "}");
    EXPECT_FALSE(c.ok()) << extra;
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    }
  }
  EXPECT_TRUE(files::ParseHfConfig("{" + base + R"(, "num_hidden_layers": 2})").ok());
}

JobSpecContext Ctx(const fs::path& root) {
  JobSpecContext c;
  c.daemon_devices = "cpu:1";
  c.num_devices = 1;
  c.allowed_roots = {root.string()};
  c.default_output_dir = (root / "out").string();
  c.max_message_bytes = 64 << 20;
  return c;
}

v1::JobSpec Tiny() {
  v1::JobSpec s;
  s.mutable_model()->set_preset("llama-tiny");
  s.mutable_batching()->set_global_batch(4);
  s.mutable_batching()->set_sequence_length(16);
  return s;
}

TEST(JobSpec, NonFiniteAndAbsurdValuesAreRefusedNamingTheField) {
  const fs::path d = TempDir("spec");
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::string what;
    std::function<void(v1::JobSpec&)> mutate;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"lr NaN (became 1e-4)", [&](auto& s) { s.mutable_optimizer()->set_lr(nan); }, "optimizer.lr"},
      {"lr inf", [&](auto& s) { s.mutable_optimizer()->set_lr(inf); }, "optimizer.lr"},
      {"lr 1e6", [&](auto& s) { s.mutable_optimizer()->set_lr(1e6); }, "lr"},
      {"weight decay NaN", [&](auto& s) { s.mutable_optimizer()->set_weight_decay(nan); }, "optimizer.weight_decay"},
      {"eps inf", [&](auto& s) { s.mutable_optimizer()->set_eps(inf); }, "optimizer.eps"},
      {"min_lr_ratio NaN", [&](auto& s) { s.mutable_optimizer()->mutable_lr_schedule()->set_min_lr_ratio(nan); },
       "optimizer.lr_schedule.min_lr_ratio"},
      {"rms_eps inf", [&](auto& s) { s.mutable_model()->set_rms_eps(inf); }, "model.rms_eps"},
      {"rms_eps 5", [&](auto& s) { s.mutable_model()->set_rms_eps(5); }, "rms_eps"},
      {"rope_theta inf", [&](auto& s) { s.mutable_model()->set_rope_theta(inf); }, "model.rope_theta"},
      {"lora alpha NaN",
       [&](auto& s) {
         s.mutable_model()->mutable_lora()->set_rank(4);
         s.mutable_model()->mutable_lora()->set_alpha(nan);
       },
       "model.lora.alpha"},
      {"rope scaling NaN", [&](auto& s) { s.mutable_model()->set_rope_scaling_factor(nan); },
       "model.rope_scaling_factor"},
      {"global batch 1e9", [&](auto& s) { s.mutable_batching()->set_global_batch(1000000000); }, "global_batch"},
      {"vocab 2^57 (overflowed the host estimate)",
       [&](auto& s) {
         s.mutable_model()->clear_preset();
         s.mutable_model()->set_family("llama");
         s.mutable_model()->set_vocab(int64_t{1} << 57);
         s.mutable_model()->set_hidden(int64_t{1} << 40);
         s.mutable_model()->set_intermediate(64);
         s.mutable_model()->set_num_blocks(2);
         s.mutable_model()->set_num_heads(2);
         s.mutable_model()->set_num_kv_heads(1);
         s.mutable_model()->set_head_dim(16);
       },
       "vocab"},
      {"keep_last huge", [&](auto& s) { s.mutable_checkpoint()->set_keep_last(1 << 30); }, "keep_last"},
  };
  ASSERT_TRUE(ResolveJobSpec(Tiny(), Ctx(d)).ok()) << ResolveJobSpec(Tiny(), Ctx(d)).status();
  for (const Case& c : cases) {
    v1::JobSpec s = Tiny();
    c.mutate(s);
    auto r = ResolveJobSpec(s, Ctx(d));
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << c.what << ": " << r.status();
  }
}

// batching.microbatches_per_round -1: the round size is chosen with the automatic partition
// (the engine's controller gets choose_round_size); below -1, or with explicit layer counts, it
// is refused naming the field.
TEST(JobSpec, ARoundSizeChosenWithTheAutomaticPartition) {
  const fs::path d = TempDir("round");
  v1::JobSpec s = Tiny();
  s.mutable_batching()->set_microbatches_per_round(-1);
  auto r = ResolveJobSpec(s, Ctx(d));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->engine.microbatches_per_round, -1);
  EXPECT_TRUE(r->engine.auto_partition);
  s.mutable_batching()->set_microbatches_per_round(-2);
  r = ResolveJobSpec(s, Ctx(d));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("microbatches_per_round -1"), std::string::npos) << r.status();
  s.mutable_batching()->set_microbatches_per_round(-1);
  s.mutable_partition()->set_fused(1);
  r = ResolveJobSpec(s, Ctx(d));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("batching.microbatches_per_round: -1"), std::string::npos) << r.status();
}

TEST(JobSpec, AStreamedBatchMustFitInOneMessage) {
  const fs::path d = TempDir("msg");
  JobSpecContext ctx = Ctx(d);
  ctx.max_message_bytes = 65536;
  v1::JobSpec s = Tiny();  // 4 x 16 tokens: fits
  ASSERT_TRUE(ResolveJobSpec(s, ctx).ok());
  s.mutable_batching()->set_global_batch(64);
  s.mutable_batching()->set_sequence_length(1024);  // 65536 tokens: cannot be sent, the job would wait forever
  auto r = ResolveJobSpec(s, ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_message_bytes"), std::string::npos) << r.status();
}

TEST(JobSpec, TheHostEstimateSaturatesInsteadOfWrapping) {
  spec::ModelConfig m;
  m.family = "llama";
  m.vocab = int64_t{1} << 57;
  m.hidden = int64_t{1} << 40;
  m.intermediate = int64_t{1} << 40;
  m.num_blocks = 1 << 30;
  m.num_heads = 1 << 30;
  m.num_kv_heads = 1 << 30;
  m.head_dim = int64_t{1} << 30;
  EXPECT_GT(planning::HostStateBytes(m, {.master_bytes = 4}), int64_t{1} << 62);
}

TEST(StatusUtil, EchoedInputIsBoundedInTheGrpcStatus) {
  const std::string huge(100000, 'x');
  const grpc::Status st = ToGrpcStatus(absl::NotFoundError("no job '" + huge + "'"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LE(st.error_message().size(), kMaxStatusMessageBytes);
  EXPECT_NE(st.error_message().find("bytes cut"), std::string::npos);
  // UTF-8 is never split.
  std::string accents;
  for (int i = 0; i < 2000; ++i) accents += "\xc3\xa9";
  const std::string cut = BoundedText(accents, 101);
  for (size_t i = 0; i + 1 < cut.find(" ..."); i += 2) EXPECT_EQ(cut.substr(i, 2), "\xc3\xa9") << i;
  // Exceptions become INTERNAL naming the handler.
  auto r = Guarded("SubmitJob", []() -> absl::StatusOr<int> { throw std::out_of_range("stoll"); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("SubmitJob"), std::string::npos);
  EXPECT_NE(r.status().message().find("stoll"), std::string::npos);
}

TEST(HostMemory, MemAvailableIsReadNotMemFree) {
  EXPECT_EQ(ParseMemAvailable("MemTotal:       24000000 kB\nMemFree:         2700000 kB\n"
                              "MemAvailable:   22000000 kB\nBuffers: 1 kB\n"),
            int64_t{22000000} * 1024);
  EXPECT_EQ(ParseMemAvailable("MemFree: 5 kB\n"), -1);
  EXPECT_EQ(ParseMemAvailable("MemAvailable: lots kB\n"), -1);
  EXPECT_GT(HostMemoryBudgetNow(), 0);
  // Running jobs' states count 3/4 as coming back; parses in flight count as taken.
  EXPECT_EQ(AdmissionBudget(1000, 400, 0), 1300);
  EXPECT_EQ(AdmissionBudget(1000, 400, 500), 800);
  EXPECT_EQ(AdmissionBudget(1000, 0, 5000), 0);
}

}  // namespace
}  // namespace rp::server

namespace rp::server {
namespace {

TEST(Config, MessageLimitMetricsExposureAndLocalhost) {
  roundpipe::v1::DaemonConfig c;
  ApplyDefaults(&c);
  c.set_max_message_bytes(int64_t{1} << 32);  // used to wrap to 0 in the int the gRPC builder takes
  absl::Status st = ValidateConfig(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("max_message_bytes"), std::string::npos) << st;
  c.set_max_message_bytes(64 << 20);
  c.set_metrics_address("0.0.0.0:9464");  // unauthenticated metrics on every interface
  st = ValidateConfig(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("metrics_address"), std::string::npos) << st;
  c.set_allow_insecure_remote(true);
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  roundpipe::v1::DaemonConfig l;
  l.add_listen("localhost:0");
  ApplyDefaults(&l);
  EXPECT_EQ(l.listen(0), "127.0.0.1:0");
}

}  // namespace
}  // namespace rp::server

#include <sqlite3.h>

#include "server/job_store.h"

namespace rp::server {
namespace {

TEST(JobStore, ADamagedRowCostsThatJobNotTheStore) {
  const fs::path d = TempDir("store");
  const std::string path = (d / "jobs.sqlite").string();
  {
    auto s = JobStore::Open(path);
    ASSERT_TRUE(s.ok());
    for (int i = 1; i <= 2; ++i) {
      v1::Job j;
      j.set_id("job-" + std::to_string(i));
      j.set_state(v1::JOB_STATE_SUCCEEDED);
      ASSERT_TRUE((*s)->Put(i, j).ok());
    }
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE jobs SET record = x'ffffffff0a' WHERE id = 'job-1'", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto s = JobStore::Open(path);
  ASSERT_TRUE(s.ok());
  auto all = (*s)->LoadAll();
  ASSERT_TRUE(all.ok()) << all.status();  // used to be DataLoss: the daemon refused to start
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].second.id(), "job-1");
  EXPECT_EQ((*all)[0].second.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE((*all)[0].second.error().find("damaged"), std::string::npos);
  EXPECT_EQ((*all)[1].second.state(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace rp::server
