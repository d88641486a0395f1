// Data, evaluation and profiles through the real roundpiped (ARCHITECTURE §6): JSONL jobs train
// like the plain reference on the tokenizers' masks, document-masked packing with validation,
// early stopping with the best checkpoint kept, and an automatic partition's profile that the
// simulator replays.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "nlohmann/json.hpp"
#include "tests/integration/daemon_process.h"
#include "tests/integration/fixtures.h"
#include "tests/support/reference_model.h"
#include "workers/io/safetensors_reader.h"
#include "workers/io/safetensors_writer.h"
#include "workers/store/host_model_store.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;
using namespace std::chrono_literals;

// make_jsonl_dataset.py's tokenizer and train/valid JSONL files in `dir`; its expected.json (the
// streams PyPI `tokenizers` gives).
nlohmann::json MakeJsonlDataset(const std::string& dir) {
  std::string out;
  EXPECT_EQ(RunCommand(std::string(RP_VENV_PYTHON) +
                           " " RP_SOURCE_DIR "/tests/unit/scheduler/runtime/make_jsonl_dataset.py " + dir,
                       &out),
            0)
      << out;
  return nlohmann::json::parse(ReadWholeFile(dir + "/expected.json"), nullptr, /*allow_exceptions=*/false);
}

// A JSONL prompt/completion dataset named in the job spec (format from the extension, the
// tokenizer dir inside an allowed root): the daemon tokenizes it and trains exactly like the plain
// reference on the tokens and loss mask PyPI `tokenizers` gives (make_jsonl_dataset.py).
TEST_F(DaemonTest, JsonlJobTrainsLikeThePlainReferenceOnTheTokenizersMasks) {
  ASSERT_TRUE(StartDaemon());
  const std::string dir = root_ + "/data/jsonl";
  std::string out;
  const nlohmann::json expected = MakeJsonlDataset(dir);
  ASSERT_TRUE(expected.is_object()) << "make_jsonl_dataset.py did not write expected.json";
  const auto tokens = expected["tokens"].get<std::vector<int64_t>>();
  const auto trained = expected["trained"].get<std::vector<int>>();
  v1::JobSpec spec = TinySpec();
  spec.mutable_model()->set_vocab(expected["vocab"].get<int64_t>());
  spec.set_max_steps(0);  // until the data ends: one epoch
  spec.mutable_data()->mutable_token_file()->set_path(dir + "/train.jsonl");
  spec.mutable_data()->mutable_token_file()->set_tokenizer_dir(dir + "/tok");
  auto c = daemon_.Connect();
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  spec::ModelConfig model = EngineModel();
  model.vocab = expected["vocab"].get<int64_t>();
  workers::HostModelStore init(model, at::kFloat, spec.model().init_seed());
  workers::AdamWOptions adamw;
  adamw.lr = spec.optimizer().lr();
  adamw.weight_decay = 0;
  adamw.eps = 1e-8;
  ReferenceModel ref(init, adamw);
  const int64_t B = 4, S = 16, batches = (static_cast<int64_t>(tokens.size()) - 1) / S / B;
  const std::vector<double> losses = w.Losses();
  ASSERT_EQ(static_cast<int64_t>(losses.size()), batches);
  for (int64_t b = 0; b < batches; ++b) {
    at::Tensor t = at::empty({B, S}, at::kLong), l = at::empty({B, S}, at::kLong);
    for (int64_t i = 0; i < B * S; ++i) {
      const int64_t k = b * B * S + i;
      t.view({-1})[i] = tokens[k];
      l.view({-1})[i] = trained[k + 1] ? tokens[k + 1] : -100;
    }
    EXPECT_NEAR(losses[static_cast<size_t>(b)], ref.Step(t, l), 2e-5) << "step " << b + 1;
  }
}

// The same JSONL data packed with document masks, and a JSONL validation file evaluated every 25
// steps and at the end: every step's loss equals the plain reference run on each window's
// document pieces one by one (the tokenizers' tokens and masks, no target across a document
// boundary), every eval loss equals the reference's mean CE over the validation windows at that
// step, and WatchJob, GetJob, the CLI and the metrics report them.
TEST_F(DaemonTest, DocumentMaskedJsonlJobWithValidationMatchesTheReference) {
  ASSERT_TRUE(StartDaemon());
  const std::string dir = root_ + "/data/jsonl";
  std::string out;
  const nlohmann::json expected = MakeJsonlDataset(dir);
  ASSERT_TRUE(expected.is_object()) << "make_jsonl_dataset.py did not write expected.json";
  const auto tokens = expected["tokens"].get<std::vector<int64_t>>();
  const auto trained = expected["trained"].get<std::vector<int>>();
  const auto starts = expected["starts"].get<std::vector<int64_t>>();
  const auto v_tokens = expected["valid_tokens"].get<std::vector<int64_t>>();
  const auto v_trained = expected["valid_trained"].get<std::vector<int>>();
  v1::JobSpec spec = TinySpec();
  spec.mutable_model()->set_vocab(expected["vocab"].get<int64_t>());
  spec.mutable_optimizer()->set_lr(3e-3);
  spec.set_max_steps(0);  // one epoch
  auto* tf = spec.mutable_data()->mutable_token_file();
  tf->set_path(dir + "/train.jsonl");
  tf->set_tokenizer_dir(dir + "/tok");
  tf->set_packing(v1::DataSource::TokenFile::PACKING_DOCUMENT_MASKED);
  spec.mutable_data()->mutable_validation()->set_path(dir + "/valid.jsonl");
  spec.mutable_data()->mutable_validation()->set_tokenizer_dir(dir + "/tok");
  spec.mutable_eval()->set_every_steps(25);
  auto c = daemon_.Connect();
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();

  spec::ModelConfig model = EngineModel();
  model.vocab = expected["vocab"].get<int64_t>();
  workers::HostModelStore init(model, at::kFloat, spec.model().init_seed());
  workers::AdamWOptions adamw;
  adamw.lr = spec.optimizer().lr();
  adamw.weight_decay = 0;
  adamw.eps = 1e-8;
  ReferenceModel ref(init, adamw);
  const int64_t B = 4, S = 16;
  const std::set<int64_t> doc_start(starts.begin(), starts.end());
  auto label_at = [](const std::vector<int64_t>& t, const std::vector<int>& m, int64_t i) {
    return m[static_cast<size_t>(i + 1)] ? t[static_cast<size_t>(i + 1)] : int64_t{-100};
  };
  // The reference eval loss: the validation windows in file order, plain concatenation.
  auto reference_eval = [&] {
    double sum = 0, count = 0;
    const int64_t vb = (static_cast<int64_t>(v_tokens.size()) - 1) / S / B;
    for (int64_t b = 0; b < vb; ++b) {
      at::Tensor t = at::empty({B, S}, at::kLong), l = at::empty({B, S}, at::kLong);
      for (int64_t i = 0; i < B * S; ++i) {
        t.view({-1})[i] = v_tokens[static_cast<size_t>(b * B * S + i)];
        l.view({-1})[i] = label_at(v_tokens, v_trained, b * B * S + i);
      }
      const double n = l.ne(-100).sum().item<double>();
      if (n > 0) sum += ref.EvalLoss(t, l) * n;
      count += n;
    }
    return sum / count;
  };
  const int64_t batches = (static_cast<int64_t>(tokens.size()) - 1) / S / B;
  const std::vector<double> losses = w.Losses();
  ASSERT_EQ(static_cast<int64_t>(losses.size()), batches);
  std::vector<std::pair<int64_t, double>> want_evals;
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<ReferenceModel::Document> docs;
    for (int64_t r = 0; r < B; ++r) {
      const int64_t start = (b * B + r) * S;
      int64_t a = start;
      for (int64_t i = start + 1; i <= start + S; ++i) {
        if (i < start + S && !doc_start.count(i)) continue;
        const int64_t n = i - a;  // the piece [a, i) of one document
        at::Tensor t = at::empty({n}, at::kLong), l = at::empty({n}, at::kLong);
        for (int64_t k = 0; k < n; ++k) {
          t[k] = tokens[static_cast<size_t>(a + k)];
          l[k] = doc_start.count(a + k + 1) ? int64_t{-100} : label_at(tokens, trained, a + k);
        }
        docs.push_back({t, l});
        a = i;
      }
    }
    EXPECT_NEAR(losses[static_cast<size_t>(b)], ref.StepDocuments(docs), 2e-5) << "step " << b + 1;
    if ((b + 1) % 25 == 0 || b + 1 == batches) want_evals.push_back({b + 1, reference_eval()});
  }
  std::vector<v1::EvalMetrics> evals;
  for (const v1::JobEvent& e : w.Events()) {
    if (e.has_eval()) evals.push_back(e.eval());
  }
  ASSERT_EQ(evals.size(), want_evals.size());
  double best = 1e300;
  for (size_t k = 0; k < evals.size(); ++k) {
    EXPECT_EQ(evals[k].step(), want_evals[k].first);
    EXPECT_NEAR(evals[k].loss(), want_evals[k].second, 2e-5) << "eval at step " << evals[k].step();
    best = std::min(best, evals[k].loss());
    EXPECT_DOUBLE_EQ(evals[k].best_loss(), best);
  }
  EXPECT_LT(evals.back().loss(), evals.front().loss()) << "the eval loss should fall";
  auto got = c->Get(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_DOUBLE_EQ(got->last_eval().loss(), evals.back().loss());
  const std::string text = HttpGet(daemon_.metrics_address(), "/metrics");
  EXPECT_DOUBLE_EQ(MetricValue(text, "roundpipe_evaluations_total"), static_cast<double>(evals.size()));
  EXPECT_NEAR(MetricValue(text, "roundpipe_eval_loss"), evals.back().loss(), 1e-9);
  ASSERT_EQ(RunCommand(std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address() + " get " + job->id(), &out),
            0);
  EXPECT_NE(out.find("eval "), std::string::npos) << out;
}

// Early stopping and the best checkpoint: trained on one token repeated and evaluated on
// random bytes, the eval loss only rises after the first evaluation, so a job with patience 2
// stops after the third, keeping the first's checkpoint although keep_last is 1.
TEST_F(DaemonTest, EarlyStoppingEndsTheJobAndKeepsTheBestCheckpoint) {
  ASSERT_TRUE(StartDaemon());
  v1::JobSpec spec = TinySpec();
  spec.mutable_optimizer()->set_lr(1e-2);
  const std::string same = root_ + "/data/same.bin";
  {
    std::ofstream f(same, std::ios::binary);
    const uint16_t seven = 7;
    for (int i = 0; i < 20000; ++i) f.write(reinterpret_cast<const char*>(&seven), 2);
  }
  spec.mutable_data()->mutable_token_file()->set_path(same);
  spec.mutable_data()->mutable_validation()->set_path(TokenFile(2000));
  spec.mutable_eval()->set_every_steps(2);
  spec.mutable_eval()->set_early_stopping_patience(2);
  spec.mutable_eval()->set_keep_best_checkpoint(true);
  spec.mutable_checkpoint()->set_every_steps(1);
  spec.mutable_checkpoint()->set_keep_last(1);
  spec.set_output_dir(root_ + "/data/out");
  spec.set_max_steps(50);
  auto c = daemon_.Connect();
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  auto got = c->Get(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->progress().step(), 6);
  EXPECT_NE(got->message().find("stopped early at step 6"), std::string::npos) << got->message();
  EXPECT_EQ(got->last_eval().best_step(), 2);
  EXPECT_EQ(got->best_checkpoint(), root_ + "/data/out/checkpoints/step-2");
  EXPECT_TRUE(std::filesystem::exists(got->best_checkpoint() + "/meta.json"));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/data/out/checkpoints/step-6/meta.json"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/data/out/checkpoints/step-4"));
}

// A job with an automatic partition writes the per-layer times it measured to
// <output_dir>/profile.json (Job.profile, a WatchJob event); `roundpipe profile` prints it and
// `roundpipe-sim --profile` replays it with the job's own partition.
TEST_F(DaemonTest, AnAutoPartitionedJobWritesAProfileThatTheSimulatorReplays) {
  ASSERT_TRUE(StartDaemon({"--devices", "cpu:2"}));
  v1::JobSpec spec = TinySpec();  // no partition: profiled, then planned
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  spec.set_output_dir(root_ + "/data/out");
  spec.set_max_steps(8);
  auto c = daemon_.Connect();
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  auto got = c->Get(job->id());
  ASSERT_TRUE(got.ok());
  const std::string path = root_ + "/data/out/profile.json";
  EXPECT_EQ(got->profile(), path);
  bool announced = false;
  for (const v1::JobEvent& e : w.Events()) announced = announced || e.profile() == path;
  EXPECT_TRUE(announced);
  const auto profile = nlohmann::json::parse(ReadWholeFile(path));
  EXPECT_EQ(profile["format"], "roundpipe.profile.v1");
  ASSERT_EQ(profile["layers"].size(), 4u);  // embedding, 2 blocks, head
  EXPECT_EQ(profile["layers"][0]["kind"], "embedding");
  EXPECT_EQ(profile["layers"][3]["kind"], "head");
  for (const auto& l : profile["layers"]) EXPECT_GT(l["fused_s"].get<double>() + l["forward_s"].get<double>(), 0);
  std::string out;
  ASSERT_EQ(
      RunCommand(std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address() + " profile " + job->id(), &out), 0)
      << out;
  EXPECT_NE(out.find("roundpipe.profile.v1"), std::string::npos) << out;
  // Replayed with the job's partition: a RoundPipe-sync schedule on 2 workers, 4 micro-batches.
  const std::string partition = got->partition();
  ASSERT_FALSE(partition.empty());
  std::string spec_arg;  // "F[2] B1=1 B[1,1]" -> "'F=2;B1=1;B=1,1'"
  {
    const std::regex shape(R"(F\[([0-9,]*)\] B1=([0-9]+) B\[([0-9,]*)\])");
    std::smatch m;
    ASSERT_TRUE(std::regex_match(partition, m, shape)) << partition;
    spec_arg = "'" + (m[1].str().empty() ? "" : "F=" + m[1].str() + ";") + "B1=" + m[2].str() +
               (m[3].str().empty() ? "" : ";B=" + m[3].str()) + "'";
  }
  ASSERT_EQ(RunCommand(std::string(RP_ROUNDPIPE_SIM) + " --profile " + path +
                           " --gpus 2 --microbatches 4 --schedule roundpipe-sync --format json --partition " + spec_arg,
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("RoundPipe-sync"), std::string::npos) << out;
}

}  // namespace
}  // namespace rp::testing
