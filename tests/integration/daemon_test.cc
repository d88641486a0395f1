// Integration tests against the real roundpiped process on 127.0.0.1 port 0, driven through the
// real client library and CLI (ARCHITECTURE §6): the job life cycle, queueing, restart, metrics.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
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
  workers::models::TransformerConfig model = EngineModel();
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

  workers::models::TransformerConfig model = EngineModel();
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

TEST_F(DaemonTest, StreamedJobTrainsLikeThePlainReferenceAndExports) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.set_max_steps(0);  // until the stream ends
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(job->state() == v1::JOB_STATE_QUEUED || job->state() == v1::JOB_STATE_RUNNING) << job->state();
  Watcher w(*c, job->id());

  // Six batches of [4, 16] byte tokens; the daemon's losses must be those of a plain LibTorch
  // model with the same initial weights trained on the same tokens (fp32, sync).
  const std::vector<int32_t> tokens = SomeTokens(6 * 4 * 16, 3);
  auto summary = c->StreamTokens(job->id(), tokens, 4, 16);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->accepted(), 6);
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  ASSERT_TRUE(w.Finished());

  workers::HostModelStore init(EngineModel(), at::kFloat, spec.model().init_seed());
  workers::AdamWOptions adamw;
  adamw.lr = spec.optimizer().lr();
  adamw.weight_decay = 0;
  adamw.eps = 1e-8;
  ReferenceModel ref(init, adamw);
  const std::vector<double> losses = w.Losses();
  ASSERT_EQ(losses.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    at::Tensor t =
        at::tensor(std::vector<int64_t>(tokens.begin() + i * 64, tokens.begin() + (i + 1) * 64)).view({4, 16});
    EXPECT_NEAR(losses[static_cast<size_t>(i)], ref.Step(t), 2e-5) << "step " << i + 1;
  }
  auto got = c->Get(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(got->progress().step(), 6);
  EXPECT_EQ(got->progress().tokens(), 6 * 4 * 15);
  EXPECT_FALSE(got->partition().empty());
  // Host memory: after its steps the job's model states hold exactly what admission predicted.
  EXPECT_GT(got->host_memory().predicted_state_bytes(), 0);
  EXPECT_EQ(got->host_memory().peak_state_bytes(), got->host_memory().predicted_state_bytes());
  EXPECT_GT(got->host_memory().peak_activation_bytes(), 0);
  auto info = c->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<std::string> pools;
  for (const v1::HostPool& p : info->host_pools()) pools.push_back(p.name());
  EXPECT_EQ(pools, (std::vector<std::string>{"model_states", "optimizer_state", "activations", "mapped_base",
                                             "registered_base", "pinned"}));

  // Export: an HF directory whose tensors are the reference's weights after the same steps.
  auto path = c->Export(job->id(), root_ + "/data/export");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(*path) / "config.json"));
  auto tensors = ReadSafetensors((std::filesystem::path(*path) / "model.safetensors").string());
  ASSERT_EQ(tensors.size(), ref.params().size());
  for (const auto& [name, want] : ref.params()) {
    ASSERT_TRUE(tensors.count(name)) << name;
    EXPECT_TRUE(at::allclose(tensors[name], want, 1e-4, 1e-5)) << name;
  }
  // The same export again: refused (nothing is overwritten), the daemon keeps serving.
  auto again = c->Export(job->id(), *path);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();

  // A new job starts from the exported directory (model.hf_dir): its first loss is the
  // reference's loss on the next batch after the same six steps.
  v1::JobSpec next;
  *next.mutable_optimizer() = spec.optimizer();
  next.set_precision(v1::PRECISION_FP32);
  *next.mutable_batching() = spec.batching();
  next.mutable_model()->set_hf_dir(*path);
  auto job2 = c->Submit(next);
  ASSERT_TRUE(job2.ok()) << job2.status();
  Watcher w2(*c, job2->id());
  const std::vector<int32_t> more = SomeTokens(64, 11);
  ASSERT_TRUE(c->StreamTokens(job2->id(), more, 4, 16).ok());
  ASSERT_TRUE(w2.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  ASSERT_EQ(w2.Losses().size(), 1u);
  EXPECT_NEAR(w2.Losses()[0], ref.Step(at::tensor(std::vector<int64_t>(more.begin(), more.end())).view({4, 16})), 2e-5);
  EXPECT_EQ(daemon_.Stop(), 0) << daemon_.Output();
}

TEST_F(DaemonTest, CancelWhileRunningAndPauseResume) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(50000));
  spec.mutable_data()->mutable_token_file()->set_max_epochs(1000);
  spec.set_max_steps(0);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForSteps(3));

  auto paused = c->Pause(job->id());
  ASSERT_TRUE(paused.ok()) << paused.status();
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_PAUSED));
  const int64_t at_pause = c->Get(job->id())->progress().step();
  // While paused nothing trains: the step counter holds (checked across a real iteration time).
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(c->Get(job->id())->progress().step(), at_pause);
  EXPECT_EQ(c->Get(job->id())->state(), v1::JOB_STATE_PAUSED);
  ASSERT_TRUE(c->Resume(job->id()).ok());
  ASSERT_TRUE(w.WaitForSteps(at_pause + 3));

  auto cancelled = c->Cancel(job->id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_CANCELLED));
  ASSERT_TRUE(w.Finished());
  EXPECT_EQ(c->Get(job->id())->state(), v1::JOB_STATE_CANCELLED);
  // Ended jobs refuse further control with FAILED_PRECONDITION.
  EXPECT_EQ(c->Cancel(job->id()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->Pause(job->id()).status().code(), absl::StatusCode::kFailedPrecondition);
  // The states came in order.
  const auto states = w.States();
  ASSERT_GE(states.size(), 4u);  // (QUEUED,) RUNNING, PAUSED, RUNNING, CANCELLED
  EXPECT_EQ(states.back(), v1::JOB_STATE_CANCELLED);
}

TEST_F(DaemonTest, QueuedJobsRunOneAfterAnotherByPriority) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  // A runs first (it waits for a stream); B (priority 0) and C (priority 5) queue behind it.
  v1::JobSpec a = TinySpec();
  a.set_max_steps(0);
  auto ja = c->Submit(a);
  ASSERT_TRUE(ja.ok());
  Watcher wa(*c, ja->id());
  ASSERT_TRUE(wa.WaitForState(v1::JOB_STATE_RUNNING));
  v1::JobSpec b = TinySpec();
  b.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  b.set_max_steps(3);
  v1::JobSpec cc = b;
  cc.set_priority(5);
  auto jb = c->Submit(b);
  auto jc = c->Submit(cc);
  ASSERT_TRUE(jb.ok() && jc.ok());
  Watcher wb(*c, jb->id()), wc(*c, jc->id());
  EXPECT_EQ(c->Get(jb->id())->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(c->Get(jc->id())->state(), v1::JOB_STATE_QUEUED);
  // Finish A by streaming two batches and closing its input.
  ASSERT_TRUE(c->StreamTokens(ja->id(), SomeTokens(2 * 64, 9), 4, 16).ok());
  ASSERT_TRUE(wa.WaitForState(v1::JOB_STATE_SUCCEEDED));
  ASSERT_TRUE(wc.WaitForState(v1::JOB_STATE_SUCCEEDED));
  ASSERT_TRUE(wb.WaitForState(v1::JOB_STATE_SUCCEEDED));
  // C (higher priority) ran entirely before B started (times are the engine's transitions).
  EXPECT_LT(wc.TimeOf(v1::JOB_STATE_SUCCEEDED), wb.TimeOf(v1::JOB_STATE_RUNNING));
  EXPECT_LT(wa.TimeOf(v1::JOB_STATE_SUCCEEDED), wc.TimeOf(v1::JOB_STATE_RUNNING));
  EXPECT_EQ(c->Get(jb->id())->progress().step(), 3);
}

TEST_F(DaemonTest, RestartListsEveryJobAndReadmitsQueuedOnes) {
  ASSERT_TRUE(StartDaemon());
  std::string done_id, cancelled_id, running_id, queued_id;
  {
    auto c = daemon_.Connect();
    v1::JobSpec quick = TinySpec();
    quick.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
    quick.set_max_steps(2);
    auto done = c->Submit(quick);
    ASSERT_TRUE(done.ok());
    done_id = done->id();
    Watcher wd(*c, done_id);
    ASSERT_TRUE(wd.WaitForState(v1::JOB_STATE_SUCCEEDED));
    v1::JobSpec streamed = TinySpec();
    streamed.set_max_steps(0);
    auto running = c->Submit(streamed);  // runs, waiting for batches
    ASSERT_TRUE(running.ok());
    running_id = running->id();
    Watcher wr(*c, running_id);
    ASSERT_TRUE(wr.WaitForState(v1::JOB_STATE_RUNNING));
    auto queued = c->Submit(quick);  // waits behind it
    ASSERT_TRUE(queued.ok());
    queued_id = queued->id();
    auto to_cancel = c->Submit(quick);
    ASSERT_TRUE(to_cancel.ok());
    cancelled_id = to_cancel->id();
    ASSERT_TRUE(c->Cancel(cancelled_id).ok());
  }
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Output();  // SIGTERM: drain, pause, exit 0
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto c = daemon_.Connect();
  auto jobs = c->List();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  std::map<std::string, v1::Job> by_id;
  for (const auto& j : *jobs) by_id[j.id()] = j;
  ASSERT_EQ(by_id.size(), 4u);
  EXPECT_EQ(by_id[done_id].state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(by_id[done_id].progress().step(), 2);
  EXPECT_EQ(by_id[cancelled_id].state(), v1::JOB_STATE_CANCELLED);
  // The running job was paused and checkpointed by the drain: it continues (waiting for data).
  EXPECT_NE(by_id[running_id].state(), v1::JOB_STATE_PAUSED);
  EXPECT_NE(daemon_.Output().find("[" + running_id + "] resumed from"), std::string::npos);
  EXPECT_FALSE(by_id[running_id].last_checkpoint().empty());
  // The job that never started is admitted again and runs to completion.
  Watcher wq(*c, queued_id);
  ASSERT_TRUE(wq.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  // New ids continue after the old ones.
  v1::JobSpec quick = TinySpec();
  quick.set_max_steps(1);
  auto fresh = c->Submit(quick);
  ASSERT_TRUE(fresh.ok());
  EXPECT_GT(fresh->id(), queued_id);
}

TEST_F(DaemonTest, MetricsScrapeHasEveryFamilyAndCountersMove) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  const std::string before = HttpGet(daemon_.metrics_address(), "/metrics");
  ASSERT_FALSE(before.empty());
  v1::JobSpec spec = TinySpec();
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  spec.set_max_steps(4);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok());
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
  const std::string text = HttpGet(daemon_.metrics_address(), "/metrics");
  // The golden list of families (ARCHITECTURE §5).
  for (const char* family :
       {"roundpipe_tokens_trained_total", "roundpipe_iterations_total", "roundpipe_iteration_duration_seconds",
        "roundpipe_optimizer_step_seconds", "roundpipe_loss", "roundpipe_learning_rate", "roundpipe_grad_norm",
        "roundpipe_bubble_ratio", "roundpipe_batches_received_total", "roundpipe_batches_rejected_total",
        "roundpipe_checkpoint_failures_total", "roundpipe_worker_busy_seconds_total", "roundpipe_transfer_bytes_total",
        "roundpipe_host_memory_bytes", "roundpipe_device_memory_bytes", "roundpipe_jobs", "roundpipe_build_info",
        "roundpipe_rpc_requests_total", "roundpipe_rpc_duration_seconds"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + family + " "), std::string::npos) << family;
  }
  EXPECT_EQ(MetricValue(before, "roundpipe_iterations_total"), 0);
  EXPECT_EQ(MetricValue(text, "roundpipe_iterations_total"), 4);
  EXPECT_EQ(MetricValue(text, "roundpipe_tokens_trained_total"), 4 * 4 * 16);
  EXPECT_GE(MetricValue(text, "roundpipe_batches_received_total"), 4);
  EXPECT_EQ(MetricValue(text, "roundpipe_iteration_duration_seconds_count"), 4);
  EXPECT_GT(MetricValue(text, "roundpipe_worker_busy_seconds_total{stream=\"compute\",worker=\"0\"}"), 0);
  EXPECT_GT(MetricValue(text, "roundpipe_worker_busy_seconds_total{stream=\"compute\",worker=\"1\"}"), 0);
  EXPECT_GT(MetricValue(text, "roundpipe_transfer_bytes_total{direction=\"host_to_device\",kind=\"parameter\"}"), 0);
  EXPECT_GT(MetricValue(text, "roundpipe_transfer_bytes_total{direction=\"device_to_host\",kind=\"gradient\"}"), 0);
  EXPECT_EQ(MetricValue(text, "roundpipe_jobs{state=\"succeeded\"}"), 1);
  EXPECT_GT(MetricValue(text, "roundpipe_loss"), 0);
  // Per-RPC counts by method and code.
  EXPECT_EQ(
      MetricValue(text, "roundpipe_rpc_requests_total{code=\"OK\",method=\"/roundpipe.v1.JobService/SubmitJob\"}"), 1);
  (void)c->Get("job-that-is-not-there");
  const std::string after = HttpGet(daemon_.metrics_address(), "/metrics");
  EXPECT_EQ(
      MetricValue(after, "roundpipe_rpc_requests_total{code=\"NOT_FOUND\",method=\"/roundpipe.v1.JobService/GetJob\"}"),
      1);
  // Every metric the shipped Grafana dashboard queries exists.
  std::ifstream dash(RP_SOURCE_DIR "/deploy/grafana-dashboard.json");
  const std::string json((std::istreambuf_iterator<char>(dash)), std::istreambuf_iterator<char>());
  const std::regex name("roundpipe_[a-z_]+");
  int used = 0;
  for (auto it = std::sregex_iterator(json.begin(), json.end(), name); it != std::sregex_iterator(); ++it, ++used) {
    std::string family = it->str();
    if (family == "roundpipe_daemon") continue;  // the dashboard's uid
    for (const char* suffix : {"_bucket", "_count", "_sum"}) {
      const std::string sfx = suffix;
      if (family.size() > sfx.size() && family.compare(family.size() - sfx.size(), sfx.size(), sfx) == 0) {
        family.resize(family.size() - sfx.size());
      }
    }
    EXPECT_NE(text.find("# TYPE " + family + " "), std::string::npos) << "dashboard uses " << it->str();
  }
  EXPECT_GT(used, 10);
}

TEST_F(DaemonTest, CliSubmitWatchLsExportAndExitCodes) {
  ASSERT_TRUE(StartDaemon());
  const std::string cli = std::string(RP_ROUNDPIPE_CLI) + " --address " + daemon_.address();
  const std::string spec_file = root_ + "/spec.json";
  std::ofstream(spec_file) << R"({"name": "cli", "model": {"family": "llama", "vocab": 256, "hidden": 32,
     "intermediate": 64, "numBlocks": 2, "numHeads": 2, "numKvHeads": 1, "headDim": 16},
     "precision": "PRECISION_FP32", "optimizer": {"lr": 0.001, "mode": "OPTIMIZER_MODE_SYNC"},
     "batching": {"globalBatch": 4, "microBatch": 1, "sequenceLength": 16},
     "data": {"tokenFile": {"path": ")" +
                                  TokenFile(20000) + R"("}}, "maxSteps": 3})";
  std::string out;
  ASSERT_EQ(RunCommand(cli + " submit --watch " + spec_file, &out), 0) << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  EXPECT_NE(out.find("step 3/3"), std::string::npos) << out;
  const std::string id = out.substr(0, out.find('\n'));
  ASSERT_EQ(RunCommand(cli + " ls", &out), 0) << out;
  EXPECT_NE(out.find(id), std::string::npos);
  ASSERT_EQ(RunCommand(cli + " export " + id + " --out " + root_ + "/data/cli-export", &out), 0) << out;
  EXPECT_TRUE(std::filesystem::exists(root_ + "/data/cli-export/model.safetensors"));
  ASSERT_EQ(RunCommand(cli + " info", &out), 0) << out;
  EXPECT_NE(out.find("cpu:1"), std::string::npos) << out;
  // Exit codes: usage 2, refused 3, unreachable 4.
  EXPECT_EQ(RunCommand(cli + " frobnicate", &out), 2) << out;
  std::ofstream(root_ + "/broken.json") << "{\"name\": ";
  EXPECT_EQ(RunCommand(cli + " submit " + root_ + "/broken.json", &out), 2) << out;
  EXPECT_NE(out.find("job spec"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(cli + " get job-999999", &out), 3) << out;
  EXPECT_NE(out.find("NOT_FOUND"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(cli + " export " + id + " --out /etc/roundpipe-nope", &out), 3) << out;
  EXPECT_NE(out.find("PERMISSION_DENIED"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(std::string(RP_ROUNDPIPE_CLI) + " --address 127.0.0.1:1 info", &out), 4) << out;
}

}  // namespace
}  // namespace rp::testing

namespace rp::testing {
namespace {

TEST_F(DaemonTest, PythonClientSubmitsStreamsAndWatchesAJob) {
  std::string out;
  ASSERT_EQ(RunCommand("/usr/bin/python3 -c 'import grpc'", &out), 0)
      << "Debian's python3-grpcio is not installed (deploy/install-deps.sh installs it): " << out;
  ASSERT_TRUE(StartDaemon());
  const std::string spec_file = root_ + "/spec.json";
  std::ofstream(spec_file) << R"({"name": "py", "model": {"family": "llama", "vocab": 256, "hidden": 32,
     "intermediate": 64, "numBlocks": 2, "numHeads": 2, "numKvHeads": 1, "headDim": 16},
     "precision": "PRECISION_FP32", "optimizer": {"lr": 0.001},
     "batching": {"globalBatch": 4, "microBatch": 1, "sequenceLength": 16}})";
  const std::string text = root_ + "/text.txt";
  {
    std::ofstream t(text);
    for (int i = 0; i < 40; ++i) t << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  const int rc = RunCommand("PYTHONPATH=" RP_PYTHON_STUBS " /usr/bin/python3 " RP_PYTHON_CLIENT " --address " +
                                daemon_.address() + " run " + spec_file + " --text " + text,
                            &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("state JOB_STATE_SUCCEEDED"), std::string::npos) << out;
  const size_t streamed = out.find("streamed ");
  ASSERT_NE(streamed, std::string::npos) << out;
  const int batches = std::stoi(out.substr(streamed + 9));
  EXPECT_EQ(batches, static_cast<int>(std::filesystem::file_size(text) / 64));
  // The daemon saw the same job: as many steps as batches streamed.
  auto c = daemon_.Connect();
  auto jobs = c->List();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].progress().step(), batches);
  EXPECT_EQ((*jobs)[0].spec().name(), "py");
}

}  // namespace
}  // namespace rp::testing

#include <sys/socket.h>
#include <sys/un.h>

namespace rp::testing {
namespace {

// systemd's notify protocol, with the test in systemd's place: a datagram socket named by
// NOTIFY_SOCKET receives READY=1, WATCHDOG=1 pings (WATCHDOG_USEC) and STOPPING=1 on SIGTERM.
TEST_F(DaemonTest, NotifiesSystemdReadyWatchdogAndStopping) {
  const std::string path = root_ + "/notify.sock";
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ASSERT_TRUE(StartDaemon({}, {{"NOTIFY_SOCKET", path}, {"WATCHDOG_USEC", "200000"}}));
  auto receive = [&](const std::string& want) {
    char buf[1024];
    for (int i = 0; i < 50; ++i) {
      const ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);  // blocks until the daemon sends
      if (n <= 0) return false;
      if (std::string(buf, static_cast<size_t>(n)).find(want) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(receive("READY=1"));
  EXPECT_TRUE(receive("WATCHDOG=1"));
  EXPECT_TRUE(receive("WATCHDOG=1"));
  kill(daemon_.pid(), SIGTERM);
  EXPECT_TRUE(receive("STOPPING=1"));
  EXPECT_EQ(daemon_.Stop(), 0);
  close(fd);
}

}  // namespace
}  // namespace rp::testing

namespace rp::testing {
namespace {

// Exact resume (issue: checkpoints): a job killed with SIGKILL at an arbitrary step, its newest
// checkpoint damaged on top, continues after a restart from the previous good checkpoint and ends
// with weights bit-identical to the same job run straight through — async optimizer included —
// so no batch of its token file was skipped or repeated.
TEST_F(DaemonTest, SigkilledJobResumesFromItsCheckpointBitIdentically) {
  ASSERT_TRUE(StartDaemon());
  v1::JobSpec spec = TinySpec();
  spec.mutable_optimizer()->set_mode(v1::OPTIMIZER_MODE_ASYNC);
  spec.mutable_optimizer()->mutable_lr_schedule()->set_kind(v1::LrScheduleSpec::KIND_WARMUP_COSINE);
  spec.mutable_optimizer()->mutable_lr_schedule()->set_warmup_steps(3);
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(30000));
  // Shuffled windows: the order must survive the kill too (it is a function of the cursor).
  spec.mutable_data()->mutable_token_file()->set_shuffle(true);
  spec.mutable_data()->mutable_token_file()->set_shuffle_seed(5);
  spec.mutable_checkpoint()->set_every_steps(2);
  spec.set_max_steps(16);
  // Evaluations every 3 steps (drain points of the async job) with the best checkpoint kept:
  // their state is in the checkpoints, so the resumed job evaluates and ends like the straight one.
  const std::string valid = root_ + "/data/valid.bin";
  {
    std::ofstream f(valid, std::ios::binary);
    for (int32_t t : SomeTokens(3000, 11)) {
      const uint16_t v = static_cast<uint16_t>(t);
      f.write(reinterpret_cast<const char*>(&v), 2);
    }
  }
  spec.mutable_data()->mutable_validation()->set_path(valid);
  spec.mutable_eval()->set_every_steps(3);
  spec.mutable_eval()->set_keep_best_checkpoint(true);
  std::string killed_id;
  const int kill_after = 7 + static_cast<int>(getpid() % 4);  // an arbitrary step in 7..10
  {
    auto c = daemon_.Connect();
    auto job = c->Submit(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    killed_id = job->id();
    Watcher w(*c, killed_id);
    ASSERT_TRUE(w.WaitForSteps(kill_after));
    daemon_.Stop(9);  // no drain, no goodbye
  }
  // Damage the newest checkpoint: the restart must notice (checksum) and take the one before.
  const std::string ckpts = root_ + "/state/jobs/" + killed_id + "/checkpoints";
  std::vector<std::string> steps;
  for (const auto& e : std::filesystem::directory_iterator(ckpts)) {
    if (e.path().filename().string().rfind("step-", 0) == 0) steps.push_back(e.path().string());
  }
  ASSERT_GE(steps.size(), 2u);
  std::sort(steps.begin(), steps.end(), [](const std::string& a, const std::string& b) {
    return std::stoi(a.substr(a.rfind('-') + 1)) < std::stoi(b.substr(b.rfind('-') + 1));
  });
  {
    std::fstream f(steps.back() + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  auto c = daemon_.Connect();
  Watcher w(*c, killed_id);
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  auto resumed = c->Get(killed_id);
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed->progress().step(), 16);
  EXPECT_NE(daemon_.Output().find("fails its checksum"), std::string::npos)
      << "the damaged checkpoint was not reported";
  // The same job straight through, in the restarted daemon.
  auto straight = c->Submit(spec);
  ASSERT_TRUE(straight.ok());
  Watcher ws(*c, straight->id());
  ASSERT_TRUE(ws.WaitForState(v1::JOB_STATE_SUCCEEDED));
  auto a = c->Export(killed_id, root_ + "/data/resumed");
  auto b = c->Export(straight->id(), root_ + "/data/straight");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  auto ta = ReadSafetensors(*a + "/model.safetensors"), tb = ReadSafetensors(*b + "/model.safetensors");
  ASSERT_EQ(ta.size(), tb.size());
  ASSERT_FALSE(ta.empty());
  for (const auto& [name, t] : ta) EXPECT_TRUE(at::equal(t, tb[name])) << name;
  // The evaluations after the restart are the straight run's, bit for bit, and so is the record.
  std::map<int64_t, double> straight_evals;
  for (const v1::JobEvent& e : ws.Events()) {
    if (e.has_eval()) straight_evals[e.eval().step()] = e.eval().loss();
  }
  EXPECT_EQ(straight_evals.size(), 6u);  // steps 3, 6, 9, 12, 15 and the end (16)
  int resumed_evals = 0;
  for (const v1::JobEvent& e : w.Events()) {
    if (!e.has_eval()) continue;
    ++resumed_evals;
    EXPECT_EQ(e.eval().loss(), straight_evals[e.eval().step()]) << "eval at step " << e.eval().step();
  }
  EXPECT_GE(resumed_evals, 3);
  auto done = c->Get(straight->id());
  resumed = c->Get(killed_id);
  ASSERT_TRUE(done.ok() && resumed.ok());
  EXPECT_EQ(resumed->last_eval().loss(), done->last_eval().loss());
  EXPECT_EQ(resumed->last_eval().best_loss(), done->last_eval().best_loss());
  EXPECT_EQ(resumed->last_eval().best_step(), done->last_eval().best_step());
  EXPECT_FALSE(done->best_checkpoint().empty());
  EXPECT_TRUE(std::filesystem::exists(resumed->best_checkpoint() + "/meta.json")) << resumed->best_checkpoint();
  // An explicit checkpoint of the finished job holds all 16 steps.
  auto ck = c->Checkpoint(straight->id());
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->step(), 16);
}

}  // namespace
}  // namespace rp::testing

namespace rp::testing {
namespace {

TEST_F(DaemonTest, LoraJobTrainsAndExportsAPeftAdapterOrMergedWeights) {
  ASSERT_TRUE(StartDaemon());
  auto c = daemon_.Connect();
  v1::JobSpec spec = TinySpec();
  spec.mutable_model()->mutable_lora()->set_rank(4);
  spec.mutable_model()->mutable_lora()->set_alpha(8);
  spec.mutable_model()->mutable_lora()->add_target_modules("q_proj");
  spec.mutable_model()->mutable_lora()->add_target_modules("down_proj");
  spec.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  spec.set_max_steps(3);
  auto job = c->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  Watcher w(*c, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  auto adapter = c->Export(job->id(), root_ + "/data/adapter");
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_TRUE(std::filesystem::exists(*adapter + "/adapter_config.json"));
  auto tensors = ReadSafetensors(*adapter + "/adapter_model.safetensors");
  EXPECT_EQ(tensors.size(), 2u * 2u * 2u);  // A and B, 2 targets, 2 blocks
  EXPECT_TRUE(tensors.count("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  auto merged = c->Export(job->id(), root_ + "/data/merged", /*merge_lora=*/true);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_TRUE(std::filesystem::exists(*merged + "/config.json"));
  // The job's checkpoints hold the adapters alone (the base is described in base.json), yet a
  // daemon restarted afterwards exports the same merged weights: the base is derived again
  // (here: from the seed) and checked against the checkpoint's record.
  auto info = c->Get(job->id());
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string ckpt = info->last_checkpoint();
  ASSERT_FALSE(ckpt.empty());
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/base.json"));
  for (const auto& [name, t] : ReadSafetensors(ckpt + "/weights.safetensors")) {
    EXPECT_NE(name.find(".lora_"), std::string::npos) << name << " is in the checkpoint";
  }
  ASSERT_EQ(daemon_.Stop(), 0) << daemon_.Output();
  ASSERT_TRUE(StartDaemon()) << daemon_.Output();
  c = daemon_.Connect();
  auto again = c->Export(job->id(), root_ + "/data/merged-after-restart", /*merge_lora=*/true);
  ASSERT_TRUE(again.ok()) << again.status();
  auto before = ReadSafetensors(*merged + "/model.safetensors");
  auto after = ReadSafetensors(*again + "/model.safetensors");
  ASSERT_EQ(before.size(), after.size());
  ASSERT_FALSE(before.empty());
  for (const auto& [name, t] : before) EXPECT_TRUE(at::equal(t, after[name])) << name;
  // Bad LoRA specs and a merge request for a full fine-tuning job.
  v1::JobSpec bad = spec;
  bad.mutable_model()->mutable_lora()->add_target_modules("lm_head");
  auto r = c->Submit(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("lora target 'lm_head'"), std::string::npos) << r.status();
  v1::JobSpec plain = TinySpec();
  plain.mutable_data()->mutable_token_file()->set_path(TokenFile(20000));
  plain.set_max_steps(1);
  auto pj = c->Submit(plain);
  ASSERT_TRUE(pj.ok());
  Watcher wp(*c, pj->id());
  ASSERT_TRUE(wp.WaitForState(v1::JOB_STATE_SUCCEEDED));
  EXPECT_EQ(c->Export(pj->id(), root_ + "/data/nope", true).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rp::testing
