// Evaluation passes (Controller::Evaluate) against the plain single-process reference: the eval
// loss equals the reference's mean CE at the same weights, sync and async (after the staleness-1
// steps), and an evaluation changes nothing of training — the weights and the run that follows
// are those of a run without it (async: of a run with a drain point there, as at a checkpoint:
// the evaluation sees every step) — and forms no gradient: its timeline holds forward and loss
// stages only, no backward stage, no gradient download.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "scheduler/runtime/controller.h"
#include "tests/support/reference_model.h"
#include "tests/support/rig.h"
#include "tests/support/tiny_models.h"
#include "tests/support/tokens.h"
#include "workers/models/layers.h"

namespace rp::scheduler {
namespace {

using rp::testing::TinyQwen3;
using spec::ModelConfig;

using rp::testing::RandomTokens;

std::map<std::string, at::Tensor> Snapshot(const workers::HostModelStore& s) {
  std::map<std::string, at::Tensor> out;
  for (int i = 0; i < s.num_params(); ++i) out[s.param(i).name] = s.param(i).fp32.clone();
  return out;
}

void ExpectEvaluationMatches(planning::OptimizerMode mode, int N, const planning::Partition& part, int M) {
  const bool async = mode == planning::OptimizerMode::kAsync;
  SCOPED_TRACE(::testing::Message() << (async ? "async" : "sync") << " N=" << N << " M=" << M << " "
                                    << part.ToString());
  const spec::ModelConfig cfg = TinyQwen3();
  workers::AdamWOptions adamw;
  adamw.lr = 2e-3;
  adamw.eps = 1e-6;  // see controller_test.cc
  ControllerOptions o;
  o.partition = part;
  o.microbatches = M;
  o.adamw = adamw;
  o.mode = mode;
  o.head_chunk_tokens = 7;
  auto e = rp::testing::MakeRig(cfg, N, o, at::kFloat, 5);
  ASSERT_TRUE(e->controller);
  Controller& c = *e->controller;
  rp::testing::ReferenceModel ref(*e->store, adamw);
  const at::Tensor held_out = RandomTokens(2 * M, 10, cfg.vocab, 77);
  at::Tensor held_labels = workers::models::ShiftLabels(held_out);
  held_labels.index_put_({0, 3}, workers::models::kIgnoreIndex);  // a masked target counts nowhere
  const double valid = held_labels.ne(workers::models::kIgnoreIndex).sum().item<double>();
  for (int k = 0; k < 5; ++k) {
    const at::Tensor t = RandomTokens(2 * M, 8, cfg.vocab, 700 + k);
    const double want = async ? ref.StaleStep(t) : ref.Step(t);
    auto st = c.RunIteration(t);  // submit + await: the next one starts after this one's step
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_NEAR(st->loss, want, 1e-5 * want);
    if (k == 1 || k == 3) {
      const auto before = Snapshot(*e->store);
      const double t0 = e->timeline.Now();
      auto ev = c.Evaluate(held_out, held_labels);
      ASSERT_TRUE(ev.ok()) << ev.status();
      EXPECT_EQ(ev->tokens, static_cast<int64_t>(valid));
      if (async) ref.Drain();
      const double ref_loss = ref.EvalLoss(held_out, held_labels);
      EXPECT_NEAR(ev->loss_sum / ev->tokens, ref_loss, 1e-5 * ref_loss) << "after step " << k + 1;
      for (const auto& [name, w] : before) EXPECT_TRUE(at::equal(w, e->store->param(e->store->FindParam(name)).fp32));
      // Forward and loss stages only: no backward, no gradient download, no weight gradient.
      int eval_ops = 0;
      for (const workers::TimelineEntry& op : e->timeline.EntriesEndingSince(t0)) {
        if (op.iteration >= -1) continue;  // evaluations run as iterations -2, -3, ...
        ++eval_ops;
        EXPECT_EQ(op.label.find("grads"), std::string::npos) << op.label;
        if (op.stream == "compute") {
          EXPECT_TRUE(op.label[0] == 'F' || op.label[0] == 'E') << op.label;
        }
      }
      EXPECT_GT(eval_ops, 0);
      for (int i = 0; i < e->store->num_params(); ++i) {
        const at::Tensor& g = e->store->param(i).grad;
        if (g.defined()) {
          EXPECT_EQ(g.abs().max().item<float>(), 0.0f) << e->store->param(i).name;
        }
      }
    }
  }
  ASSERT_TRUE(c.Flush().ok());
  // The run with two evaluations in it trained exactly like the reference without any (async:
  // with its two drain points).
  for (const auto& [name, w] : ref.params()) {
    EXPECT_LT(rp::testing::RelativeError(e->store->param(e->store->FindParam(name)).fp32, w), 1e-5) << name;
  }
}

TEST(Evaluate, EqualsTheReferenceLossAndLeavesTrainingUntouched) {
  ExpectEvaluationMatches(planning::OptimizerMode::kSync, 1, {{}, 5, {}}, 1);
  ExpectEvaluationMatches(planning::OptimizerMode::kSync, 3, {{2, 1}, 2, {2, 1}}, 3);
  ExpectEvaluationMatches(planning::OptimizerMode::kSync, 2, {{1, 1, 1, 1}, 1, {4}}, 4);
  ExpectEvaluationMatches(planning::OptimizerMode::kAsync, 3, {{2, 1}, 2, {2, 1}}, 3);
  ExpectEvaluationMatches(planning::OptimizerMode::kAsync, 2, {{4}, 1, {1, 1, 1, 1}}, 2);
}

TEST(Evaluate, RefusedWhileAnIterationIsInFlight) {
  const spec::ModelConfig cfg = TinyQwen3();
  ControllerOptions o;
  o.partition = {{2, 1}, 2, {2, 1}};
  o.microbatches = 2;
  o.mode = planning::OptimizerMode::kAsync;
  auto e = rp::testing::MakeRig(cfg, 2, o);
  ASSERT_TRUE(e->controller);
  auto it = e->controller->SubmitIteration(RandomTokens(4, 8, cfg.vocab, 1));
  ASSERT_TRUE(it.ok());
  EXPECT_EQ(e->controller->Evaluate(RandomTokens(4, 8, cfg.vocab, 2)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e->controller->AwaitIteration(*it).ok());
  EXPECT_TRUE(e->controller->Evaluate(RandomTokens(4, 8, cfg.vocab, 2)).ok());
  EXPECT_EQ(e->controller->Evaluate(RandomTokens(3, 8, cfg.vocab, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);  // 3 rows in 2 micro-batches
}

}  // namespace
}  // namespace rp::scheduler
