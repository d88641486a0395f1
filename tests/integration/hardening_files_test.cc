// The daemon under attack through the files a client with an allowed root controls: damaged
// checkpoints and .npy headers at start, FIFOs, /dev/zero and symlinks in model dirs, output dirs
// swapped for symlinks after submit, pruning through a symlink, jobs sharing an output dir,
// exports after a restart and under a file. Every test failed (crash, hang, escape or silent
// loss) against the daemon before its fix; nothing outside the allowed root is ever read,
// written or deleted (the sentinel tree of hardening_fixture.h).
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

// <out>/tensorboard a symlink to a directory outside: the job trains, its TensorBoard log is
// refused (logged), nothing is written outside (the fixture checks the outside stays untouched).
TEST_F(HardeningTest, TensorBoardNeverWritesThroughASymlink) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  const std::string out = root_ + "/data/out";
  fs::create_directories(out);
  fs::create_symlink(outside_->dir(), out + "/tensorboard");
  v1::JobSpec spec = TinySpec();
  spec.set_output_dir(out);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(c->StreamBatches(job->id(), Batches(job->id(), 2)).ok());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
  EXPECT_NE(daemon_.Output().find("no TensorBoard log"), std::string::npos) << daemon_.Output();
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
