// The daemon under attack by a client with an allowed root, and under faults (issue "harden the
// daemon"): damaged files at start, crafted .npy headers, FIFOs, /dev/zero and symlinks in model
// dirs, output dirs swapped for symlinks after submit, jobs sharing an output dir, a full disk,
// fp16 divergence, a truncated job store, an oversized job id, a drain with a user-paused job.
// Every test failed (crash, hang, escape or silent loss) against the daemon before the fix.
// Nothing outside the allowed root is ever read, written or deleted: each test keeps sentinel
// files in <root>/outside and checks them at the end.
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

namespace rp::testing {
namespace {

namespace fs = std::filesystem;
namespace v1 = roundpipe::v1;
using absl::StatusCode;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A file tree outside the allowed root, fingerprinted so a test can prove it was not touched.
class Outside {
 public:
  explicit Outside(const std::string& dir) : dir_(dir) {
    fs::create_directories(dir_ + "/ckpts/step-101");
    fs::create_directories(dir_ + "/ckpts/step-102");
    std::ofstream(dir_ + "/secret.txt") << "TOPSECRET-do-not-read-me-0123456789\n";
    std::ofstream(dir_ + "/ckpts/step-101/meta.json") << R"({"format": "roundpipe-checkpoint-1"})";
    std::ofstream(dir_ + "/ckpts/step-102/meta.json") << R"({"format": "roundpipe-checkpoint-1"})";
    before_ = Listing();
  }
  std::string Listing() const {
    std::string out;
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    for (const auto& n : names) out += n + (fs::is_regular_file(n) ? " " + Slurp(n) : "") + "\n";
    return out;
  }
  bool Untouched() const { return Listing() == before_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, before_;
};

std::vector<v1::Batch> Batches(const std::string& job, int n) {
  std::vector<v1::Batch> out;
  for (int i = 0; i < n; ++i) out.push_back(TinyBatch(i == 0 ? job : "", static_cast<uint32_t>(100 + i)));
  return out;
}

// A .npy of uint16 tokens below 256 (valid for the tiny model) whatever its header claims.
std::string Npy(const std::string& descr, const std::string& shape, size_t payload_bytes) {
  std::string payload;
  for (size_t i = 0; i < payload_bytes; ++i) payload += static_cast<char>(i % 2 ? 0 : (i / 2) % 200);
  return NpyBytes(descr, shape, payload);
}

class HardeningTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    outside_ = std::make_unique<Outside>(root_ + "/outside");
  }
  void TearDown() override {
    if (outside_) {
      EXPECT_TRUE(outside_->Untouched()) << "files outside the allowed root changed";
    }
    DaemonTest::TearDown();
  }
  // Submits a tiny job (cancelled when `cancel`), then stops the daemon with `signal`; the id.
  std::string SubmitOneThenStop(bool cancel, int signal) {
    auto c = daemon_.Connect();
    auto a = c->Submit(TinySpec());
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return "";
    if (cancel) {
      EXPECT_TRUE(c->Cancel(a->id()).ok());
    }
    EXPECT_EQ(daemon_.Stop(signal), signal == 15 ? 0 : -1);
    return a->id();
  }
  // A Hugging Face directory of the tiny model, made by the daemon itself (train 1 step, export).
  std::string BaseModel(client::Client& c, const std::string& name = "base") {
    v1::JobSpec spec = TinySpec();
    spec.set_output_dir(root_ + "/data/" + name + "-job");
    auto job = c.Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    Watcher w(c, job->id());
    EXPECT_TRUE(c.StreamBatches(job->id(), Batches(job->id(), 1)).ok());
    EXPECT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
    auto dir = c.Export(job->id(), root_ + "/data/" + name);
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.ok() ? *dir : "";
  }
  static v1::JobSpec HfSpec(const std::string& dir) {
    v1::JobSpec spec = TinySpec();
    spec.mutable_model()->Clear();
    spec.mutable_model()->set_hf_dir(dir);
    return spec;
  }
  std::unique_ptr<Outside> outside_;
};

// 1. Damaged files at start: a checkpoint meta.json with a field of the wrong type and a queued
//    token-file job whose .npy header now claims more than 2^64 tokens used to abort every start
//    (exit 134, a crash loop under systemd). Now the daemon serves, the damaged job is listed
//    with a reason and the rest keep going.
TEST_F(HardeningTest, DamagedCheckpointMetaAndNpyHeaderNeverAbortTheStart) {
  ASSERT_TRUE(StartDaemon());
  std::string running_id, queued_id;
  const std::string npy = root_ + "/data/tokens.npy";
  std::ofstream(npy, std::ios::binary) << Npy("<u2", "(4000,)", 8000);
  {
    auto c = daemon_.Connect();
    auto running = c->Submit(TinySpec());
    ASSERT_TRUE(running.ok()) << running.status();
    running_id = running->id();
    Watcher w(*c, running_id);
    ASSERT_TRUE(c->StreamBatches(running_id, {TinyBatch(running_id, 1, /*keep_open=*/true)}).ok());
    ASSERT_TRUE(w.WaitForSteps(1));
    v1::JobSpec file_job = TinySpec();
    file_job.mutable_data()->mutable_token_file()->set_path(npy);
    auto queued = c->Submit(file_job);  // waits behind the running job
    ASSERT_TRUE(queued.ok()) << queued.status();
    queued_id = queued->id();
    daemon_.Stop(9);
  }
  const std::string meta_dir = root_ + "/state/jobs/" + running_id + "/checkpoints/step-999";
  fs::create_directories(meta_dir);
  std::ofstream(meta_dir + "/meta.json") << R"({"format": 1})";
  std::ofstream(npy, std::ios::binary | std::ios::trunc) << Npy("<u2", "(99999999999999999999999,)", 8000);

  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto c = daemon_.Connect();
  auto running = c->Get(running_id);
  ASSERT_TRUE(running.ok()) << running.status();
  EXPECT_EQ(running->state(), v1::JOB_STATE_PAUSED) << running->message();
  EXPECT_NE(running->message().find("no usable checkpoint"), std::string::npos) << running->message();
  auto queued = c->Get(queued_id);
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(queued->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(queued->error().find("shape"), std::string::npos) << queued->error();
  // ... and it still trains new jobs.
  auto fresh = c->Submit(TinySpec());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  Watcher w(*c, fresh->id());
  ASSERT_TRUE(c->StreamBatches(fresh->id(), Batches(fresh->id(), 2)).ok());
  EXPECT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
}

// 2. A crafted .npy whose shape times the element size wraps 64 bits passed the size check and
//    the feeder read past the mapping (SIGSEGV). Now Submit refuses it naming the shape.
TEST_F(HardeningTest, AnNpyShapeThatWrapsIsRefusedAtSubmit) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  for (const char* shape : {"(9223372036854775807,)", "(4611686018427387904,)", "(99999999999999999999999,)"}) {
    const std::string npy = root_ + "/data/evil.npy";
    std::ofstream(npy, std::ios::binary | std::ios::trunc) << Npy("<u2", shape, 4096);
    v1::JobSpec spec = TinySpec();
    spec.mutable_data()->mutable_token_file()->set_path(npy);
    auto job = c->Submit(spec);
    ASSERT_FALSE(job.ok()) << shape;
    EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument) << shape << ": " << job.status();
    EXPECT_NE(job.status().message().find("shape"), std::string::npos) << job.status();
  }
  EXPECT_TRUE(c->Info().ok());
}

// 3. FIFOs and /dev/zero in a model dir: a submit used to block the callback thread forever (two
//    of them froze every RPC and SIGTERM), /dev/zero was read without bound. Now each answers at
//    once and the server keeps serving.
TEST_F(HardeningTest, FifosAndDevZeroInAModelDirNeverBlockTheServer) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  const std::string base = BaseModel(*c);
  ASSERT_FALSE(base.empty());
  const std::string fifo_cfg = root_ + "/data/fifo-config", fifo_weights = root_ + "/data/fifo-weights",
                    zero = root_ + "/data/zero-config";
  for (const auto& d : {fifo_cfg, fifo_weights, zero}) fs::create_directories(d);
  ASSERT_EQ(mkfifo((fifo_cfg + "/config.json").c_str(), 0644), 0);
  fs::copy_file(base + "/config.json", fifo_weights + "/config.json");
  ASSERT_EQ(mkfifo((fifo_weights + "/model.safetensors").c_str(), 0644), 0);
  fs::create_symlink("/dev/zero", zero + "/config.json");

  auto submit = [&](const std::string& dir) {
    return std::async(std::launch::async, [&c, dir] { return c->Submit(HfSpec(dir)); });
  };
  auto a = submit(fifo_cfg), b = submit(fifo_cfg), w = submit(fifo_weights), z = submit(zero);
  for (auto* f : {&a, &b, &w, &z}) {
    if (f->wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      daemon_.Stop(9);  // releases the hanging calls (the futures wait for them)
      FAIL() << "a submit hangs";
    }
  }
  for (auto* f : {&a, &b, &w}) {
    auto r = f->get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status();
  }
  auto rz = z.get();
  ASSERT_FALSE(rz.ok());
  EXPECT_EQ(rz.status().code(), StatusCode::kPermissionDenied) << rz.status();
  EXPECT_TRUE(c->Info().ok());
  EXPECT_EQ(daemon_.Stop(15), 0);  // SIGTERM is not held up by anything
}

// 4. Symlinks inside a model dir: followed to anywhere before (any readable file could be loaded
//    and exported; an error leaked a file's first bytes and size). Relative symlinks that stay
//    inside the root still work (Hugging Face cache snapshots are relative links into blobs/).
TEST_F(HardeningTest, SymlinksInAModelDirStayInsideTheRoots) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  const std::string base = BaseModel(*c);
  ASSERT_FALSE(base.empty());
  // Inside the root: accepted.
  const std::string linked = root_ + "/data/linked";
  fs::create_directories(linked);
  fs::create_symlink("../base/config.json", linked + "/config.json");
  fs::create_symlink("../base/model.safetensors", linked + "/model.safetensors");
  auto ok = c->Submit(HfSpec(linked));
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_TRUE(c->Cancel(ok->id()).ok());
  // Out of the root: a copy of the same model (valid files!) and a secret.
  fs::copy(base, outside_->dir() + "/model");
  Outside* o = outside_.release();  // the copy changed the listing: re-fingerprint
  outside_ = std::make_unique<Outside>(o->dir());
  delete o;
  struct Case {
    std::string config, weights;
  };
  for (const Case& k : {Case{outside_->dir() + "/model/config.json", base + "/model.safetensors"},
                        Case{base + "/config.json", outside_->dir() + "/model/model.safetensors"},
                        Case{base + "/config.json", outside_->dir() + "/secret.txt"}}) {
    const std::string dir = root_ + "/data/escape";
    fs::remove_all(dir);
    fs::create_directories(dir);
    fs::create_symlink(k.config, dir + "/config.json");
    fs::create_symlink(k.weights, dir + "/model.safetensors");
    auto r = c->Submit(HfSpec(dir));
    ASSERT_FALSE(r.ok()) << k.config << " " << k.weights;
    EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status();
    EXPECT_EQ(r.status().message().find("TOPSECRET"), std::string::npos) << r.status();
    EXPECT_EQ(r.status().message().find("header length"), std::string::npos) << r.status();
  }
}

// 5. The output dir replaced by a symlink after submit: checkpoints and exports went outside the
//    roots. Now every write is confined at use: the checkpoints fail (reported), nothing lands
//    outside, an export into the swapped dir is refused and one elsewhere works.
TEST_F(HardeningTest, AnOutputDirSwappedForASymlinkAfterSubmitLeadsNowhere) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  const std::string out = root_ + "/data/out";
  v1::JobSpec spec = TinySpec();
  spec.set_output_dir(out);
  spec.mutable_checkpoint()->set_every_steps(1);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  fs::rename(out, root_ + "/data/out.moved");
  fs::create_symlink(outside_->dir(), out);
  Watcher w(*c, job->id());
  ASSERT_TRUE(c->StreamBatches(job->id(), Batches(job->id(), 2)).ok());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
  auto rec = c->Get(job->id());
  ASSERT_TRUE(rec.ok());
  EXPECT_NE(rec->message().find("checkpoint at step"), std::string::npos) << rec->message();
  auto e = c->Export(job->id());  // default: <out>/export-step2, i.e. through the symlink
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kPermissionDenied) << e.status();
  auto e2 = c->Export(job->id(), root_ + "/data/elsewhere");
  EXPECT_TRUE(e2.ok()) << e2.status();
}

// 6. <out>/checkpoints a symlink to a directory outside: keep_last pruning deleted files there.
TEST_F(HardeningTest, PruningNeverDeletesThroughASymlink) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  const std::string out = root_ + "/data/out";
  fs::create_directories(out);
  fs::create_symlink(outside_->dir() + "/ckpts", out + "/checkpoints");
  v1::JobSpec spec = TinySpec();
  spec.set_output_dir(out);
  spec.mutable_checkpoint()->set_every_steps(1);
  spec.mutable_checkpoint()->set_keep_last(1);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(c->StreamBatches(job->id(), Batches(job->id(), 2)).ok());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
  // A checkpoint inside the roots (replace the link by a real dir): pruning works there.
  fs::remove(out + "/checkpoints");
  auto ck = c->Checkpoint(job->id());
  EXPECT_TRUE(ck.ok()) << ck.status();
}

// 7. Jobs that shared an output dir used and pruned each other's checkpoints. Now a job owns it.
TEST_F(HardeningTest, JobsCannotShareAnOutputDir) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.set_output_dir(root_ + "/data/shared");
  auto a = c->Submit(spec);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = c->Submit(spec);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition) << b.status();
  EXPECT_NE(b.status().message().find("belongs to job " + a->id()), std::string::npos) << b.status();
  // Still after A ended: its checkpoints stay its own.
  ASSERT_TRUE(c->Cancel(a->id()).ok());
  EXPECT_EQ(c->Submit(spec).status().code(), StatusCode::kFailedPrecondition);
  spec.set_output_dir(root_ + "/data/own");
  EXPECT_TRUE(c->Submit(spec).ok());
}

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

// A finished job's weights survived only in memory: after any restart (even SIGTERM) ExportModel
// said "no weights in this daemon". Now the final state is a checkpoint written before the job is
// reported ended (and the host store is freed): the export after a SIGKILL or a SIGTERM restart
// equals the one before, for a succeeded and a cancelled job.
TEST_F(HardeningTest, AFinishedJobExportsTheSameAfterARestart) {
  ASSERT_TRUE(StartDaemon());
  std::string done_id, cancelled_id;
  std::map<std::string, at::Tensor> done_before, cancelled_before;
  {
    auto c = daemon_.Connect();
    auto done = c->Submit(TinySpec());
    ASSERT_TRUE(done.ok());
    done_id = done->id();
    Watcher w(*c, done_id);
    ASSERT_TRUE(c->StreamBatches(done_id, Batches(done_id, 3)).ok());
    ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
    auto rec = c->Get(done_id);
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(rec->last_checkpoint_step(), 3) << "the final checkpoint is reported";
    auto cancelled = c->Submit(TinySpec());
    ASSERT_TRUE(cancelled.ok());
    cancelled_id = cancelled->id();
    Watcher wc(*c, cancelled_id);
    ASSERT_TRUE(c->StreamBatches(cancelled_id, {TinyBatch(cancelled_id, 9, /*keep_open=*/true)}).ok());
    ASSERT_TRUE(wc.WaitForSteps(1));
    ASSERT_TRUE(c->Cancel(cancelled_id).ok());
    ASSERT_TRUE(wc.WaitForState(v1::JOB_STATE_CANCELLED));
    auto a = c->Export(done_id, root_ + "/data/done-before");
    auto b = c->Export(cancelled_id, root_ + "/data/cancelled-before");
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    done_before = ReadSafetensors(*a + "/model.safetensors");
    cancelled_before = ReadSafetensors(*b + "/model.safetensors");
    ASSERT_FALSE(done_before.empty());
  }
  int round = 0;
  for (int sig : {9, 15}) {
    daemon_.Stop(sig);
    ASSERT_TRUE(StartDaemon()) << daemon_.Output();
    auto c = daemon_.Connect();
    ++round;
    for (const auto& [id, before] : {std::pair{done_id, &done_before}, std::pair{cancelled_id, &cancelled_before}}) {
      auto e = c->Export(id, root_ + "/data/" + id + "-after-" + std::to_string(round));
      ASSERT_TRUE(e.ok()) << "signal " << sig << ": " << e.status();
      auto after = ReadSafetensors(*e + "/model.safetensors");
      ASSERT_EQ(after.size(), before->size());
      for (const auto& [name, t] : *before) EXPECT_TRUE(at::equal(t, after[name])) << name << " after signal " << sig;
    }
  }
}

// 14 (minor). An export under a regular file named a clear cause instead of "rename ...: Success".
TEST_F(HardeningTest, ExportUnderAFileSaysWhy) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  auto job = c->Submit(TinySpec());
  ASSERT_TRUE(job.ok());
  Watcher w(*c, job->id());
  ASSERT_TRUE(c->StreamBatches(job->id(), Batches(job->id(), 1)).ok());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
  std::ofstream(root_ + "/data/afile") << "x";
  auto e = c->Export(job->id(), root_ + "/data/afile/export");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition) << e.status();
  EXPECT_NE(e.status().message().find("not a directory"), std::string::npos) << e.status();
}

}  // namespace
}  // namespace rp::testing

namespace rp::testing {
namespace {

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
