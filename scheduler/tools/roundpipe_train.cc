// roundpipe-train — trains a small Llama-style model on a synthetic, learnable token task with
// the engine facade (the same engine the daemon will drive), printing one progress line per step.
//
//   roundpipe-train --devices cpu:2 --steps 100 --mode async --precision bf16
//
// The task: every sequence counts upwards modulo the vocabulary, so the loss must fall from
// ln(vocab) towards 0. Exit codes: 0 trained, 2 bad arguments, 1 the job failed.
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "scheduler/engine.h"

ABSL_FLAG(std::string, devices, "cpu:2",
          "Devices: cpu:N, cuda (every GPU) or cuda:I,J,... (a GPU listed twice gets two workers)");
ABSL_FLAG(int, steps, 100, "Optimizer steps");
ABSL_FLAG(std::string, mode, "async", "Optimizer mode: sync or async (staleness 1)");
ABSL_FLAG(std::string, precision, "fp32", "Master copy / compute precision: fp32, bf16 or fp16");
ABSL_FLAG(std::string, family, "qwen3", "Model family: llama or qwen3 (q/k-norm, tied embeddings)");
ABSL_FLAG(int, hidden, 128, "Model width");
ABSL_FLAG(int, blocks, 4, "Decoder blocks");
ABSL_FLAG(int, vocab, 128, "Vocabulary size");
ABSL_FLAG(int, batch, 8, "Sequences per step");
ABSL_FLAG(int, seq, 64, "Sequence length");
ABSL_FLAG(int, microbatches, 0, "Micro-batches per step (0 = number of devices)");
ABSL_FLAG(double, lr, 3e-3, "Peak learning rate (linear warm-up over 10% of the steps, then cosine)");
ABSL_FLAG(bool, auto_partition, true, "Profile one layer per stage, then partition from measured times");

namespace {

int Fail(const std::string& why, int code) {
  std::fprintf(stderr, "roundpipe-train: %s\n", why.c_str());
  return code;
}

// The demo job from the flags; InvalidArgument naming the bad flag.
absl::StatusOr<rp::scheduler::JobSpec> SpecFromFlags() {
  rp::scheduler::JobSpec spec;
  spec.name = "demo";
  auto& m = spec.model;
  m.family = absl::GetFlag(FLAGS_family);
  m.qk_norm = m.family == "qwen3";
  m.tied_embeddings = m.family == "qwen3";
  m.vocab = absl::GetFlag(FLAGS_vocab);
  m.hidden = absl::GetFlag(FLAGS_hidden);
  m.intermediate = m.hidden * 8 / 3;
  m.num_blocks = absl::GetFlag(FLAGS_blocks);
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = m.hidden / 4;
  const std::string prec = absl::GetFlag(FLAGS_precision);
  if (prec != "fp32" && prec != "bf16" && prec != "fp16") {
    return absl::InvalidArgumentError("--precision must be fp32, bf16 or fp16");
  }
  spec.precision = prec == "bf16"   ? rp::scheduler::Precision::kBFloat16
                   : prec == "fp16" ? rp::scheduler::Precision::kFloat16
                                    : rp::scheduler::Precision::kFloat32;
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "sync" && mode != "async") return absl::InvalidArgumentError("--mode must be sync or async");
  spec.optimizer_mode = mode == "async" ? rp::planning::OptimizerMode::kAsync : rp::planning::OptimizerMode::kSync;
  const int steps = absl::GetFlag(FLAGS_steps);
  if (steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  spec.max_steps = steps;
  spec.microbatches = absl::GetFlag(FLAGS_microbatches);
  spec.auto_partition = absl::GetFlag(FLAGS_auto_partition);
  spec.optimizer.lr = absl::GetFlag(FLAGS_lr);
  spec.optimizer.weight_decay = 0.01;
  spec.optimizer.max_grad_norm = 1.0;
  spec.lr_schedule = {rp::spec::LrSchedule::Kind::kWarmupCosine, std::max(1, steps / 10), steps, 0.1};
  spec.max_queued_batches = 4;
  return spec;
}

// Streams `steps` batches of counting sequences from random starts into the job (backpressure
// from its bounded queue), then closes its input.
std::thread StartCountingFeeder(rp::scheduler::Engine* engine, rp::scheduler::JobId id, int steps, int64_t vocab) {
  const int64_t B = absl::GetFlag(FLAGS_batch), S = absl::GetFlag(FLAGS_seq);
  return std::thread([engine, id, steps, vocab, B, S] {
    std::mt19937_64 gen(11);
    for (int s = 0; s < steps; ++s) {
      rp::scheduler::Batch batch;
      batch.rows = B;
      batch.cols = S;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t start = static_cast<int64_t>(gen() % static_cast<uint64_t>(vocab));
        for (int64_t t = 0; t < S; ++t) batch.tokens.push_back(static_cast<int32_t>((start + t) % vocab));
      }
      if (!engine->FeedBatch(id, std::move(batch), std::chrono::minutes(5)).ok()) return;
    }
    (void)engine->CloseInput(id);
  });
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("train a small model on a synthetic counting task with the roundpipe engine");
  absl::ParseCommandLine(argc, argv);
  using rp::scheduler::JobEvent;
  using rp::scheduler::JobState;

  auto spec = SpecFromFlags();
  if (!spec.ok()) return Fail(std::string(spec.status().message()), 2);
  const auto& m = spec->model;
  const int64_t V = m.vocab;
  auto engine = rp::scheduler::Engine::Create({absl::GetFlag(FLAGS_devices)});
  if (!engine.ok()) return Fail(std::string(engine.status().message()), 2);
  auto id = (*engine)->Submit(*spec);
  if (!id.ok()) return Fail(std::string(id.status().message()), 2);
  std::thread feeder = StartCountingFeeder(engine->get(), *id, static_cast<int>(spec->max_steps), V);

  std::printf("roundpipe-train: %s model, %d blocks, hidden %lld, vocab %lld, %s, %s optimizer, %s\n", m.family.c_str(),
              m.num_blocks, static_cast<long long>(m.hidden), static_cast<long long>(V),
              absl::GetFlag(FLAGS_precision).c_str(), absl::GetFlag(FLAGS_mode).c_str(),
              absl::GetFlag(FLAGS_devices).c_str());
  JobState state = JobState::kQueued;
  std::string error;
  double first_loss = -1, last_loss = 0;
  while (state == JobState::kQueued || state == JobState::kRunning) {
    auto events = (*engine)->AwaitEvents(*id, std::chrono::seconds(1));
    if (!events.ok()) break;
    for (const JobEvent& e : *events) {
      if (e.kind == JobEvent::Kind::kState) {
        state = e.state;
        if (!e.message.empty()) error = e.message;
      } else if (e.kind == JobEvent::Kind::kIteration) {
        const auto& st = e.stats;
        if (first_loss < 0) first_loss = st.loss;
        last_loss = st.loss;
        std::printf("step %4d  loss %7.4f  tokens/s %8.0f  lr %.2e  grad-norm %7.3f  bubble %5.1f%%  %s\n",
                    st.iteration + 1, st.loss, static_cast<double>(st.tokens) / std::max(1e-9, st.seconds), st.lr,
                    st.grad_norm, 100 * st.bubble_ratio, st.partition.c_str());
      }
    }
  }
  feeder.join();
  if (state != JobState::kSucceeded)
    return Fail(std::string("job ended ") + rp::scheduler::JobStateName(state) + ": " + error, 1);
  std::printf("done: loss %.4f -> %.4f (ln(vocab) = %.2f)\n", first_loss, last_loss, std::log(static_cast<double>(V)));
  return 0;
}
