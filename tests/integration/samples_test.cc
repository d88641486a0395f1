// Sample generations (issue: what a fine-tuner looks at): a job with eval.samples generates a
// completion of each prompt at every evaluation, from the weights evaluated, through its own
// pipeline. Seen in WatchJob's eval events, GetJob's last_eval, TensorBoard's text tab and
// `roundpipe samples`; the final ones equal what PyPI transformers' greedy `generate` makes from
// the job's export, token for token. Bad sample options are refused at Submit.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/integration/fixtures.h"
#include "tests/support/run_command.h"
#include "tests/support/tensorboard_reader.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;

const std::vector<std::string> kPrompts = {"Hello", "The quick brown fox jumps"};
constexpr int kNewTokens = 5;

// transformers' greedy ids for each prompt's bytes, from the model directory `dir`.
std::vector<std::vector<int32_t>> TransformersGreedy(const std::string& dir) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : kPrompts) prompts.emplace_back(p.begin(), p.end());
  std::string out;
  const int rc =
      RunCommand(std::string(RP_VENV_PYTHON) + " " + RP_SOURCE_DIR + "/tests/unit/workers/io/hf_generate.py " + dir +
                     " " + std::to_string(kNewTokens) + " '" + nlohmann::json(prompts).dump() + "'",
                 &out);
  EXPECT_EQ(rc, 0) << out;
  if (rc != 0) return {};
  const size_t end = out.find_last_not_of('\n');
  const size_t begin = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1))
      .get<std::vector<std::vector<int32_t>>>();
}

TEST_F(DaemonTest, SamplesAtEveryEvaluationEqualTransformersOnTheExport) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  spec.set_max_steps(8);
  const std::string valid = ValidationFile(2000);
  spec.mutable_data()->mutable_validation()->set_path(valid);
  spec.mutable_eval()->set_every_steps(4);
  for (const std::string& p : kPrompts) spec.mutable_eval()->mutable_samples()->add_prompts(p);
  spec.mutable_eval()->mutable_samples()->set_max_new_tokens(kNewTokens);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();

  std::vector<v1::EvalMetrics> evals;
  for (const v1::JobEvent& e : w.Events()) {
    if (e.has_eval()) evals.push_back(e.eval());
  }
  ASSERT_EQ(evals.size(), 2u);  // steps 4 and 8
  for (const v1::EvalMetrics& m : evals) {
    ASSERT_EQ(m.samples_size(), 2) << m.DebugString();
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(m.samples(i).prompt(), kPrompts[static_cast<size_t>(i)]);
      EXPECT_EQ(m.samples(i).token_ids_size(), kNewTokens);
      EXPECT_FALSE(m.samples(i).completion().empty());
    }
  }
  auto rec = c->Get(job->id());
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->last_eval().SerializeAsString(), evals.back().SerializeAsString()) << "GetJob's last_eval";

  // The final samples come from the final weights: transformers' greedy generate on the export.
  auto exported = c->Export(job->id(), root_ + "/data/export");
  ASSERT_TRUE(exported.ok()) << exported.status();
  const auto want = TransformersGreedy(*exported);
  ASSERT_EQ(want.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const auto& ids = evals.back().samples(i).token_ids();
    EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), want[static_cast<size_t>(i)]) << "prompt " << i;
  }

  // TensorBoard's text tab: each prompt's samples at both evaluation steps.
  const nlohmann::json tb = ReadTensorBoard(root_ + "/state/jobs/" + job->id() + "/tensorboard");
  for (int i = 0; i < 2; ++i) {
    const std::string tag = "samples/" + std::to_string(i);
    ASSERT_TRUE(tb["texts"].contains(tag)) << tb.dump();
    ASSERT_EQ(tb["texts"][tag].size(), 2u);
    EXPECT_EQ(tb["texts"][tag][0][0], 4);
    EXPECT_EQ(tb["texts"][tag][1][0], 8);
    const std::string text = tb["texts"][tag][1][1];
    EXPECT_NE(text.find(kPrompts[static_cast<size_t>(i)]), std::string::npos) << text;
    EXPECT_NE(text.find(evals.back().samples(i).completion()), std::string::npos) << text;
  }
  // The CLI.
  std::string out;
  ASSERT_EQ(
      RunCommand(std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address() + " samples " + job->id(), &out), 0)
      << out;
  EXPECT_NE(out.find("samples at step 8"), std::string::npos) << out;
  EXPECT_NE(out.find("--- prompt\nThe quick brown fox jumps\n--- completion (5 tokens)"), std::string::npos) << out;
}

TEST_F(DaemonTest, BadSampleOptionsAreRefusedAtSubmit) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  auto refused = [&](const v1::JobSpec& spec, const std::string& field) {
    auto job = c->Submit(spec);
    ASSERT_FALSE(job.ok()) << field;
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << job.status();
    EXPECT_NE(job.status().message().find(field), std::string::npos) << job.status();
  };
  v1::JobSpec base = TinySpec();
  base.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  base.set_max_steps(2);
  v1::JobSpec no_validation = base;
  no_validation.mutable_eval()->mutable_samples()->add_prompts("hi");
  refused(no_validation, "data.validation");
  const std::string valid = root_ + "/data/valid.bin";
  std::ofstream(valid, std::ios::binary) << std::string(4000, '\x01');
  base.mutable_data()->mutable_validation()->set_path(valid);
  v1::JobSpec empty_prompt = base;
  empty_prompt.mutable_eval()->mutable_samples()->add_prompts("");
  refused(empty_prompt, "eval.samples.prompts[0]");
  v1::JobSpec too_long = base;
  too_long.mutable_eval()->mutable_samples()->add_prompts("hi");
  too_long.mutable_eval()->mutable_samples()->set_max_new_tokens(5000);
  refused(too_long, "eval.samples.max_new_tokens");
  v1::JobSpec too_hot = base;
  too_hot.mutable_eval()->mutable_samples()->add_prompts("hi");
  too_hot.mutable_eval()->mutable_samples()->set_temperature(-1);
  refused(too_hot, "eval.samples.temperature");
  v1::JobSpec many = base;
  for (int i = 0; i < 17; ++i) many.mutable_eval()->mutable_samples()->add_prompts("hi");
  refused(many, "eval.samples.prompts");
  v1::JobSpec small_vocab = base;
  small_vocab.mutable_model()->set_vocab(100);
  small_vocab.mutable_eval()->mutable_samples()->add_prompts("hi");
  refused(small_vocab, "tokenizer");
}

}  // namespace
}  // namespace rp::testing
