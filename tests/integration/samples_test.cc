// Sample generations (issue: what a fine-tuner looks at): a job with eval.samples generates a
// completion of each prompt at every evaluation, from the weights evaluated, through its own
// pipeline. Seen in WatchJob's eval events, GetJob's last_eval, TensorBoard's text tab and
// `roundpipe samples`; the final ones equal what PyPI transformers' greedy `generate` makes from
// the job's export, token for token. Bad sample options are refused at Submit. Generate answers
// from a finished job's final weights.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
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

// Submits `spec` and waits until the job SUCCEEDED (the job's record then).
absl::StatusOr<v1::Job> Finished(client::Client& c, const v1::JobSpec& spec) {
  auto job = c.Submit(spec);
  if (!job.ok()) return job.status();
  Watcher w(c, job->id());
  if (!w.WaitForState(v1::JOB_STATE_SUCCEEDED)) return absl::InternalError("the job did not succeed");
  return job;
}

// The host memory the daemon's engine holds in model states now (GetServerInfo).
int64_t ModelStateBytes(client::Client& c) {
  auto info = c.Info();
  if (!info.ok()) return -1;
  for (const v1::HostPool& p : info->host_pools()) {
    if (p.name() == "model_states") return p.bytes();
  }
  return -1;
}

// The JSON list on the last line of a command's output.
nlohmann::json LastLineJson(const std::string& out) {
  const size_t end = out.find_last_not_of('\n');
  const size_t begin = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1, end - begin));
}

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
  return LastLineJson(out).get<std::vector<std::vector<int32_t>>>();
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

// Generate answers from a finished job's final weights (its final checkpoint, loaded on demand):
// transformers' greedy ids on the export, from the daemon that ran the job and from a restarted
// one; through the CLI too. A job that has not ended, an unknown one and bad options are refused.
TEST_F(DaemonTest, GenerateAnswersFromAFinishedJobsFinalWeightsAcrossARestart) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  spec.set_max_steps(6);
  auto job = Finished(*c, spec);
  ASSERT_TRUE(job.ok()) << job.status() << daemon_.Output();
  v1::SamplePolicy sampling;
  for (const std::string& p : kPrompts) sampling.add_prompts(p);
  sampling.set_max_new_tokens(kNewTokens);

  auto exported = c->Export(job->id(), root_ + "/data/export");
  ASSERT_TRUE(exported.ok()) << exported.status();
  const auto want = TransformersGreedy(*exported);
  ASSERT_EQ(want.size(), 2u);
  auto check = [&](const absl::StatusOr<v1::GenerateResponse>& r, const std::string& when) {
    ASSERT_TRUE(r.ok()) << when << ": " << r.status();
    EXPECT_EQ(r->step(), 6) << when;
    EXPECT_NE(r->checkpoint().find("step-6"), std::string::npos) << when << ": " << r->checkpoint();
    ASSERT_EQ(r->samples_size(), 2) << when;
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(r->samples(i).prompt(), kPrompts[static_cast<size_t>(i)]);
      const auto& ids = r->samples(i).token_ids();
      EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.end()), want[static_cast<size_t>(i)]) << when << ", prompt " << i;
    }
  };
  check(c->Generate(job->id(), sampling), "the daemon that ran it");

  // Refused: unknown job, bad options (naming the field), a job that has not ended.
  EXPECT_EQ(c->Generate("job-999999", sampling).status().code(), absl::StatusCode::kNotFound);
  v1::SamplePolicy bad = sampling;
  bad.set_max_new_tokens(5000);
  auto refused = c->Generate(job->id(), bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("sampling.max_new_tokens"), std::string::npos) << refused.status();
  EXPECT_EQ(c->Generate(job->id(), v1::SamplePolicy()).status().code(), absl::StatusCode::kInvalidArgument);
  auto streamed = c->Submit(TinySpec());  // waits for batches: RUNNING
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  auto running = c->Generate(streamed->id(), sampling);
  EXPECT_EQ(running.status().code(), absl::StatusCode::kFailedPrecondition) << running.status();
  // The streamed job holds the daemon's one running slot: the generation does not wait for it.
  check(c->Generate(job->id(), sampling), "beside a running job");
  ASSERT_TRUE(c->Cancel(streamed->id()).ok());

  // A restarted daemon has only the job's record and files.
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Output();
  ASSERT_TRUE(StartDaemon());
  c = daemon_.Connect();
  check(c->Generate(job->id(), sampling), "a restarted daemon");

  std::string out;
  ASSERT_EQ(RunCommand(std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address() + " generate " + job->id() +
                           " --prompt Hello --max_new_tokens 5 'The quick brown fox jumps'",
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("from step 6"), std::string::npos) << out;
  EXPECT_NE(out.find("--- prompt\nHello\n--- completion (5 tokens)"), std::string::npos) << out;
  EXPECT_NE(out.find("--- prompt\nThe quick brown fox jumps\n--- completion (5 tokens)"), std::string::npos) << out;
  ASSERT_NE(RunCommand(std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address() + " generate " + job->id() +
                           " --prompt Hello --max_new_tokens 2000",
                       &out),
            0);
  EXPECT_NE(out.find("sampling.max_new_tokens"), std::string::npos) << out;
}

// Chat prompts: conversations rendered with the model's own chat template by the Python client
// (`chat-prompts`, transformers' apply_chat_template), completed by `roundpipe generate
// --sampling_file` from a job trained on a chat token dataset with that tokenizer: the ids equal
// transformers' greedy generate on the export, prompted with apply_chat_template's own ids.
TEST_F(DaemonTest, ChatPromptsRenderedWithTheModelsTemplateGenerateLikeTransformers) {
  const std::string dir = root_ + "/data/chat";
  const std::string py = RP_VENV_PYTHON;
  const std::string client_dir = std::string(RP_SOURCE_DIR) + "/client/python";
  std::string out;
  ASSERT_EQ(RunCommand(py + " " + RP_SOURCE_DIR + "/tests/unit/scheduler/runtime/make_chat_dataset.py " + dir + " " +
                           client_dir,
                       &out),
            0)
      << out;
  const std::string chats = dir + "/prompts.jsonl";
  std::ofstream(chats) << R"({"messages": [{"role": "system", "content": "you are a helpful assistant"},)"
                       << R"( {"role": "user", "content": "what is the capital of France ?"}]})"
                       << "\n"
                       << R"({"messages": [{"role": "user", "content": "two plus three"},)"
                       << R"( {"role": "assistant", "content": "five"}, {"role": "user", "content": "thanks 🙂"}]})"
                       << "\n";
  const std::string sampling = dir + "/sampling.json";
  ASSERT_EQ(RunCommand(py + " " + client_dir + "/roundpipe_client.py chat-prompts --model-dir " + dir +
                           "/model_plain --input " + chats + " --out " + sampling,
                       &out),
            0)
      << out;

  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.mutable_model()->set_vocab(320);  // the tokenizer's 300 ids and room
  spec.mutable_data()->mutable_token_file()->set_path(dir + "/plain.safetensors");
  spec.mutable_data()->mutable_token_file()->set_tokenizer_dir(dir + "/model_plain");
  spec.set_max_steps(4);
  auto job = Finished(*c, spec);
  ASSERT_TRUE(job.ok()) << job.status() << daemon_.Output();

  ASSERT_EQ(RunCommand(std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address() + " generate " + job->id() +
                           " --sampling_file " + sampling + " --max_new_tokens 6 --json",
                       &out),
            0)
      << out;
  const nlohmann::json got = nlohmann::json::parse(out);
  ASSERT_EQ(got["samples"].size(), 2u) << out;
  auto exported = c->Export(job->id(), root_ + "/data/export");
  ASSERT_TRUE(exported.ok()) << exported.status();
  std::string oracle;
  ASSERT_EQ(RunCommand(py + " " + RP_SOURCE_DIR + "/tests/unit/workers/io/hf_chat_generate.py " + *exported + " " +
                           dir + "/model_plain 6 " + chats,
                       &oracle),
            0)
      << oracle;
  const auto want = LastLineJson(oracle).get<std::vector<std::vector<int32_t>>>();
  ASSERT_EQ(want.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& sample = got["samples"][i];
    EXPECT_NE(sample["prompt"].get<std::string>().find("<|im_start|>assistant\n"), std::string::npos) << sample;
    EXPECT_EQ(sample["token_ids"].get<std::vector<int32_t>>(), want[i]) << "conversation " << i;
  }
}

// A long generation ends when its client gives up (the CLI killed: the call is cancelled) —
// the weights it loaded are freed — and a SIGTERM during one drains the daemon promptly.
TEST_F(DaemonTest, AClientThatGivesUpOrASigtermEndsALongGeneration) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  spec.set_max_steps(2);
  auto job = Finished(*c, spec);
  ASSERT_TRUE(job.ok()) << job.status() << daemon_.Output();
  ASSERT_EQ(ModelStateBytes(*c), 0);
  const std::string long_generation = std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address() + " generate " +
                                      job->id() + " --max_new_tokens 1024 a b c d e f g h i j k l m n o p";
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread gives_up([&] { (void)RunCommand("timeout -s INT 3 " + long_generation, &out); });
  bool loaded = false;
  for (int i = 0; i < 30 && !loaded; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    loaded = ModelStateBytes(*c) > 0;
  }
  EXPECT_TRUE(loaded) << "the generation never held its weights";
  gives_up.join();
  bool freed = false;
  for (int i = 0; i < 100 && !freed; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    freed = ModelStateBytes(*c) == 0;
  }
  EXPECT_TRUE(freed) << "the abandoned generation still holds its weights";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);

  std::string drained;
  int rc = 0;
  std::thread during([&] { rc = RunCommand(long_generation, &drained); });
  for (int i = 0; i < 30 && ModelStateBytes(*c) <= 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(daemon_.Stop(), 0) << daemon_.Output();  // SIGTERM: drain
  during.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 20.0);
  EXPECT_NE(rc, 0) << drained;
  EXPECT_TRUE(drained.find("UNAVAILABLE") != std::string::npos || drained.find("draining") != std::string::npos ||
              drained.find("unreachable") != std::string::npos || drained.find("shutting down") != std::string::npos)
      << drained;
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
