// What a job's TensorBoard log holds (server/job_tensorboard.h): the spec's set fields as
// hyperparameters, a step's scalars from its metrics, a disabled or refused log that leaves the
// job alone. The files themselves are read back by TensorBoard in tensorboard_test and in the
// daemon's SIGKILL-and-resume test.
#include "server/job_tensorboard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "tests/support/temp_dir.h"

namespace rp::server {
namespace {

namespace v1 = roundpipe::v1;
namespace fs = std::filesystem;

TEST(JobTensorBoard, TheSpecsSetFieldsBecomeHyperparametersByDottedName) {
  v1::JobSpec spec;
  spec.mutable_model()->set_preset("qwen3-tiny");
  spec.mutable_optimizer()->set_lr(3e-4);
  spec.mutable_optimizer()->set_mode(v1::OPTIMIZER_MODE_ASYNC);
  spec.set_max_steps(16);
  spec.mutable_eval()->set_keep_best_checkpoint(true);
  spec.mutable_partition()->add_forward(3);
  spec.mutable_partition()->add_forward(2);
  std::map<std::string, tensorboard::EventLog::HParam> got;
  for (auto& [name, value] : SpecHParams(spec)) got[name] = value;
  const std::map<std::string, tensorboard::EventLog::HParam> want = {
      {"model.preset", std::string("qwen3-tiny")},
      {"optimizer.lr", 3e-4},
      {"optimizer.mode", std::string("OPTIMIZER_MODE_ASYNC")},
      {"max_steps", 16.0},
      {"eval.keep_best_checkpoint", true},
      {"partition.forward", std::string("3,2")}};
  EXPECT_EQ(got, want);  // unset fields (defaults) are not listed
}

TEST(JobTensorBoard, AStepLogsItsMetrics) {
  scheduler::IterationStats st;
  st.loss_scale = 1024;
  st.host_state_bytes = 123456789;
  st.seconds = 0.25;
  v1::StepMetrics m;
  m.set_step(7);
  m.set_loss(2.5);
  m.set_learning_rate(1e-4);
  m.set_grad_norm(0.75);
  m.set_tokens_per_second(4096);
  m.set_bubble_ratio(0.125);
  const tensorboard::EventLog::Scalars want = {{"train/loss", 2.5},
                                               {"train/learning_rate", 1e-4},
                                               {"train/grad_norm", 0.75},
                                               {"train/loss_scale", 1024},
                                               {"train/tokens_per_second", 4096},
                                               {"train/bubble_ratio", 0.125},
                                               {"train/host_state_bytes", 123456789},
                                               {"train/step_seconds", 0.25}};
  EXPECT_EQ(StepScalars(st, m), want);
}

TEST(JobTensorBoard, ADisabledLogWritesNothingAndAnEnabledOneDoes) {
  const fs::path out = rp::testing::FreshTempDir("job_tb", "off");
  v1::Job record;
  record.mutable_spec()->mutable_tensorboard()->set_disabled(true);
  JobTensorBoard off("job-000001", record, out.string());
  scheduler::JobEvent e;
  e.kind = scheduler::JobEvent::Kind::kIteration;
  v1::JobEvent sent;
  sent.mutable_step()->set_step(1);
  off.OnEvent(e, sent);
  EXPECT_FALSE(off.active());
  EXPECT_FALSE(fs::exists(out / "tensorboard"));
  // (A symlink leading out of the daemon's roots is refused by the confinement: the daemon's
  // hardening test TensorBoardNeverWritesThroughASymlink.)
  record.mutable_spec()->mutable_tensorboard()->set_disabled(false);
  JobTensorBoard on("job-000001", record, out.string());
  EXPECT_FALSE(fs::exists(out / "tensorboard")) << "nothing before the first step";
  on.OnEvent(e, sent);
  EXPECT_TRUE(on.active());
  EXPECT_TRUE(fs::is_directory(out / "tensorboard"));
  EXPECT_EQ(std::distance(fs::directory_iterator(out / "tensorboard"), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace rp::server
