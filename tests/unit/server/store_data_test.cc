// The SQLite job store (a real file, reopened) and job-spec rules.
#include <gtest/gtest.h>
#include <unistd.h>
#include <functional>
#include <limits>

#include <filesystem>
#include <fstream>

#include "scheduler/planning/host_state.h"
#include "scheduler/planning/presets.h"
#include "server/job_spec.h"
#include "server/job_store.h"
#include "tests/support/temp_dir.h"

namespace rp::server {
namespace {
namespace fs = std::filesystem;
namespace v1 = roundpipe::v1;

fs::path TempDir(const std::string& name) { return rp::testing::FreshTempDir("store_test", name); }

TEST(JobStore, JobsSurviveReopeningTheFile) {
  const fs::path d = TempDir("store");
  const std::string path = (d / "jobs.sqlite").string();
  {
    auto s = JobStore::Open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 1; i <= 3; ++i) {
      v1::Job j;
      j.set_id("job-" + std::to_string(i));
      j.set_state(v1::JOB_STATE_QUEUED);
      j.mutable_spec()->set_name("n" + std::to_string(i));
      ASSERT_TRUE((*s)->Put(i, j).ok());
    }
    v1::Job j2;
    j2.set_id("job-2");
    j2.set_state(v1::JOB_STATE_SUCCEEDED);
    j2.mutable_progress()->set_step(42);
    ASSERT_TRUE((*s)->Put(2, j2).ok());  // replaces
  }
  auto s = JobStore::Open(path);
  ASSERT_TRUE(s.ok());
  auto all = (*s)->LoadAll();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].second.id(), "job-1");
  EXPECT_EQ((*all)[1].second.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ((*all)[1].second.progress().step(), 42);
  EXPECT_EQ(*(*s)->MaxSeq(), 3);
  EXPECT_FALSE(JobStore::Open((d / "no" / "such" / "dir" / "x.sqlite").string()).ok());
}

JobSpecContext Ctx(const fs::path& root) {
  JobSpecContext c;
  c.daemon_devices = "cpu:2";
  c.num_devices = 2;
  c.allowed_roots = {root.string()};
  c.default_output_dir = (root / "out").string();
  return c;
}

TEST(JobSpec, PresetsDefaultsAndOverrides) {
  const fs::path d = TempDir("spec");
  v1::JobSpec s;
  s.mutable_model()->set_preset("qwen3-tiny");
  s.mutable_model()->set_num_blocks(2);
  s.mutable_batching()->set_global_batch(8);
  s.mutable_batching()->set_micro_batch(2);
  s.mutable_batching()->set_sequence_length(64);
  auto r = ResolveJobSpec(s, Ctx(d));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->engine.model.family, "qwen3");
  EXPECT_TRUE(r->engine.model.qk_norm);
  EXPECT_EQ(r->engine.model.num_blocks, 2);
  EXPECT_EQ(r->engine.model.vocab, 256);
  EXPECT_EQ(r->engine.microbatches, 4);
  EXPECT_EQ(r->engine.precision, scheduler::Precision::kBFloat16);
  EXPECT_EQ(r->engine.optimizer_mode, planning::OptimizerMode::kAsync);
  EXPECT_TRUE(r->engine.auto_partition);
  EXPECT_TRUE(r->streamed());
  EXPECT_EQ(r->output_dir, (d / "out").string());
  EXPECT_FALSE(r->engine.optimizer.bf16_moments);  // fp32 moments unless asked
  s.mutable_optimizer()->set_bf16_moments(true);
  auto bf16 = ResolveJobSpec(s, Ctx(d));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_TRUE(bf16->engine.optimizer.bf16_moments);
  // The update rule: AdamW unless asked; SGD's and Lion's options, their defaults and refusals.
  using Algorithm = spec::OptimizerAlgorithm;
  EXPECT_EQ(r->engine.optimizer.algorithm, Algorithm::kAdamW);
  EXPECT_EQ(ResolveJobSpec(s, Ctx(d)).value().engine.optimizer.beta2, 0.999);
  {  // validated in the optimizer's precision: below 1 as a double but 1 as a float is refused
    v1::JobSpec near = s;
    near.mutable_optimizer()->set_beta2(0.999999999999);
    auto refused = ResolveJobSpec(near, Ctx(d));
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.status().message().find("optimizer.beta2: 0.999999999999"), std::string::npos)
        << refused.status();
    EXPECT_NE(refused.status().message().find("rounds to 1 in the optimizer's float32"), std::string::npos);
    near.mutable_optimizer()->set_beta2(0.99999994);  // the largest float below 1
    EXPECT_TRUE(ResolveJobSpec(near, Ctx(d)).ok());
    near.mutable_optimizer()->set_beta1(0.99999999);
    EXPECT_NE(ResolveJobSpec(near, Ctx(d)).status().message().find("optimizer.beta1"), std::string::npos);
  }
  v1::JobSpec opt = s;
  opt.mutable_optimizer()->set_bf16_moments(false);
  opt.mutable_optimizer()->set_algorithm(v1::OPTIMIZER_ALGORITHM_LION);
  auto lion = ResolveJobSpec(opt, Ctx(d));
  ASSERT_TRUE(lion.ok()) << lion.status();
  EXPECT_EQ(lion->engine.optimizer.algorithm, Algorithm::kLion);
  EXPECT_EQ(lion->engine.optimizer.beta2, 0.99);  // Lion's own default
  opt.mutable_optimizer()->set_algorithm(v1::OPTIMIZER_ALGORITHM_SGD);
  opt.mutable_optimizer()->set_momentum(0.9);
  opt.mutable_optimizer()->set_nesterov(true);
  auto sgd = ResolveJobSpec(opt, Ctx(d));
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  EXPECT_EQ(sgd->engine.optimizer.algorithm, Algorithm::kSgd);
  EXPECT_EQ(sgd->engine.optimizer.momentum, 0.9);
  EXPECT_TRUE(sgd->engine.optimizer.nesterov);
  const std::vector<std::pair<std::function<void(v1::OptimizerSpec*)>, std::string>> bad = {
      {[](v1::OptimizerSpec* o) { o->set_dampening(0.5); }, "optimizer.nesterov"},
      {[](v1::OptimizerSpec* o) { o->set_momentum(1.5); }, "momentum must lie in [0, 1)"},
      {[](v1::OptimizerSpec* o) { o->set_bf16_moments(true); }, "only AdamW"},
      {[](v1::OptimizerSpec* o) { o->set_algorithm(v1::OPTIMIZER_ALGORITHM_LION); }, "are SGD's"},
      {[](v1::OptimizerSpec* o) { o->set_algorithm(static_cast<v1::OptimizerAlgorithm>(9)); }, "unknown value 9"}};
  for (const auto& [mutate, want] : bad) {
    v1::JobSpec b = opt;
    mutate(b.mutable_optimizer());
    auto st = ResolveJobSpec(b, Ctx(d)).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_NE(st.message().find(want), std::string::npos) << st;
  }
  // Adafactor: torch's defaults (lr 1e-2 when unset, beta2_decay -0.8, eps2 1e-3, clip 1), its own
  // options refused elsewhere and AdamW's refused with it; its numbers go through the same
  // finiteness check as every other field.
  v1::JobSpec af = s;
  af.mutable_optimizer()->Clear();
  af.mutable_optimizer()->set_algorithm(v1::OPTIMIZER_ALGORITHM_ADAFACTOR);
  auto ada = ResolveJobSpec(af, Ctx(d));
  ASSERT_TRUE(ada.ok()) << ada.status();
  EXPECT_EQ(ada->engine.optimizer.algorithm, Algorithm::kAdafactor);
  EXPECT_EQ(ada->engine.optimizer.lr, 1e-2);
  EXPECT_EQ(ada->engine.optimizer.beta2_decay, -0.8);
  EXPECT_EQ(ada->engine.optimizer.eps1, 0);
  EXPECT_EQ(ada->engine.optimizer.eps2, 1e-3);
  EXPECT_EQ(ada->engine.optimizer.clip_threshold, 1.0);
  af.mutable_optimizer()->set_beta2_decay(-0.5);
  af.mutable_optimizer()->set_clip_threshold(2);
  EXPECT_EQ(ResolveJobSpec(af, Ctx(d)).value().engine.optimizer.beta2_decay, -0.5);
  const std::vector<std::pair<std::function<void(v1::OptimizerSpec*)>, std::string>> bad_adafactor = {
      {[](v1::OptimizerSpec* o) { o->set_beta1(0.9); }, "Adafactor has no beta1"},
      {[](v1::OptimizerSpec* o) { o->set_eps(1e-8); }, "Adafactor has no beta1, beta2 or eps"},
      {[](v1::OptimizerSpec* o) { o->set_beta2_decay(0.5); }, "optimizer.beta2_decay"},
      {[](v1::OptimizerSpec* o) { o->set_clip_threshold(0.5); }, "optimizer.clip_threshold"},
      {[](v1::OptimizerSpec* o) { o->set_eps2(2); }, "eps1 and eps2"},
      {[](v1::OptimizerSpec* o) { o->set_eps1(std::numeric_limits<double>::quiet_NaN()); },
       "optimizer.eps1: nan is not a finite number"},
      {[](v1::OptimizerSpec* o) { o->set_bf16_moments(true); }, "only AdamW"},
      {[](v1::OptimizerSpec* o) {
         o->set_algorithm(v1::OPTIMIZER_ALGORITHM_LION);
         o->set_eps2(0.01);
       },
       "are Adafactor's"}};
  for (const auto& [mutate, want] : bad_adafactor) {
    v1::JobSpec b = af;
    mutate(b.mutable_optimizer());
    auto st = ResolveJobSpec(b, Ctx(d)).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << want;
    EXPECT_NE(st.message().find(want), std::string::npos) << st;
  }
  for (const auto& name : planning::ModelPresetNames()) EXPECT_TRUE(planning::ModelPreset(name).ok()) << name;
  // Devices: empty, "auto" or exactly the daemon's.
  for (const char* devices : {"auto", "cpu:2"}) {
    s.set_devices(devices);
    EXPECT_TRUE(ResolveJobSpec(s, Ctx(d)).ok()) << devices;
  }
}

TEST(JobSpec, BadSpecsGetMessagesThatNameTheField) {
  const fs::path d = TempDir("badspec");
  auto base = [] {
    v1::JobSpec s;
    s.mutable_model()->set_preset("llama-tiny");
    s.mutable_batching()->set_global_batch(4);
    s.mutable_batching()->set_sequence_length(16);
    return s;
  };
  struct Case {
    std::string what;
    std::function<void(v1::JobSpec&)> mutate;
    absl::StatusCode code;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"unknown preset", [](auto& s) { s.mutable_model()->set_preset("gpt-9"); }, absl::StatusCode::kInvalidArgument,
       "unknown preset 'gpt-9'"},
      {"no model", [](auto& s) { s.mutable_model()->clear_preset(); }, absl::StatusCode::kInvalidArgument,
       "give a preset"},
      {"negative hidden", [](auto& s) { s.mutable_model()->set_hidden(-5); }, absl::StatusCode::kInvalidArgument,
       "model.hidden"},
      {"heads do not divide", [](auto& s) { s.mutable_model()->set_num_kv_heads(3); },
       absl::StatusCode::kInvalidArgument, "model:"},
      {"negative batch", [](auto& s) { s.mutable_batching()->set_global_batch(-1); },
       absl::StatusCode::kInvalidArgument, "batching"},
      {"batch not multiple of micro", [](auto& s) { s.mutable_batching()->set_micro_batch(3); },
       absl::StatusCode::kInvalidArgument, "not a multiple of micro_batch"},
      {"fewer micro-batches than devices", [](auto& s) { s.mutable_batching()->set_micro_batch(4); },
       absl::StatusCode::kInvalidArgument, "fewer than the 2 devices"},
      {"bad beta", [](auto& s) { s.mutable_optimizer()->set_beta1(1.5); }, absl::StatusCode::kInvalidArgument, "beta1"},
      {"cosine without length",
       [](auto& s) { s.mutable_optimizer()->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::KIND_WARMUP_COSINE); },
       absl::StatusCode::kInvalidArgument, "total_steps"},
      {"partition does not cover",
       [](auto& s) {
         s.mutable_partition()->add_forward(2);
         s.mutable_partition()->set_fused(1);
       },
       absl::StatusCode::kInvalidArgument, "cover the 6 layers"},
      {"other devices", [](auto& s) { s.set_devices("cpu:7"); }, absl::StatusCode::kFailedPrecondition, "devices"},
      {"token file outside roots", [](auto& s) { s.mutable_data()->mutable_token_file()->set_path("/etc/passwd"); },
       absl::StatusCode::kPermissionDenied, "outside the allowed roots"},
      {"output dir via ..", [d](auto& s) { s.set_output_dir((d / ".." / "elsewhere").string()); },
       absl::StatusCode::kPermissionDenied, "output_dir"},
      {"hf dir with preset", [](auto& s) { s.mutable_model()->set_hf_dir("/x"); }, absl::StatusCode::kInvalidArgument,
       "either hf_dir"},
      {"hf dir outside roots",
       [](auto& s) {
         s.mutable_model()->clear_preset();
         s.mutable_model()->set_hf_dir("/usr");
       },
       absl::StatusCode::kPermissionDenied, "model.hf_dir"},
      {"negative max_steps", [](auto& s) { s.set_max_steps(-3); }, absl::StatusCode::kInvalidArgument, "max_steps"},
  };
  ASSERT_TRUE(ResolveJobSpec(base(), Ctx(d)).ok()) << ResolveJobSpec(base(), Ctx(d)).status();
  for (const Case& c : cases) {
    v1::JobSpec s = base();
    c.mutate(s);
    auto r = ResolveJobSpec(s, Ctx(d));
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), c.code) << c.what << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << c.what << ": " << r.status();
  }
  // A model too large for the host budget is refused before anything is allocated.
  JobSpecContext small = Ctx(d);
  small.host_memory_budget = [] { return int64_t{1} << 30; };
  v1::JobSpec big = base();
  big.mutable_model()->set_preset("llama-3.1-8b");
  big.mutable_batching()->set_global_batch(2);
  EXPECT_EQ(ResolveJobSpec(big, small).status().code(), absl::StatusCode::kResourceExhausted);
  // LoRA on the same 8B base fits in ~16 GiB (2 bytes per frozen base parameter, bf16), where full
  // fine-tuning needs ~130 GiB.
  JobSpecContext host20g = Ctx(d);
  host20g.host_memory_budget = [] { return int64_t{20} << 30; };
  EXPECT_EQ(ResolveJobSpec(big, host20g).status().code(), absl::StatusCode::kResourceExhausted);
  big.mutable_model()->mutable_lora()->set_rank(16);
  auto lora = ResolveJobSpec(big, host20g);
  ASSERT_TRUE(lora.ok()) << lora.status();
  const int64_t need = planning::HostStateBytes(lora->engine.model, {.master_bytes = 2});
  EXPECT_GT(need, int64_t{15} << 30);
  EXPECT_LT(need, int64_t{17} << 30);
}

}  // namespace
}  // namespace rp::server

#include <google/protobuf/util/json_util.h>

#include <sstream>

namespace rp::server {
namespace {

TEST(JobSpec, TheShippedExampleIsAcceptedByTheDaemonRules) {
  std::ifstream f(RP_SOURCE_DIR "/deploy/examples/job-qwen3-tiny.json");
  std::stringstream ss;
  ss << f.rdbuf();
  v1::JobSpec spec;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ss.str(), &spec).ok());
  const fs::path d = TempDir("example");
  auto r = ResolveJobSpec(spec, Ctx(d));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->streamed());
  EXPECT_EQ(r->engine.max_steps, 200);
  EXPECT_EQ(r->engine.lr_schedule.kind, spec::LrSchedule::Kind::kWarmupCosine);
  // The checkpoint policy reaches the engine; checkpoints live under the output dir.
  spec.mutable_checkpoint()->set_every_steps(50);
  auto with_policy = ResolveJobSpec(spec, Ctx(d));
  ASSERT_TRUE(with_policy.ok());
  EXPECT_EQ(with_policy->engine.checkpoint_every, 50);
  EXPECT_EQ(with_policy->engine.checkpoint_keep_last, 3);
  EXPECT_EQ(with_policy->engine.checkpoint_root, (d / "out" / "checkpoints").string());
}

}  // namespace
}  // namespace rp::server
