// Document-masked packing against its independent reference: the same documents run one by one
// through the plain single-process model (tests/support), each on its own with plain causal
// attention and positions from 0. A packed batch (several documents per row, positions
// restarting at each, no target across a boundary) must give the same loss and, after three
// AdamW steps, the same weights — on one and on three CPU workers, with partitions that cut
// inside rows of documents. The same batch without its positions must not.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/token_dataset.h"
#include "tests/support/reference_model.h"
#include "tests/support/rig.h"
#include "tests/support/tiny_models.h"
#include "tests/support/tokens.h"
#include "workers/models/layers.h"

namespace rp::scheduler {
namespace {

using rp::testing::TinyLlama;
using spec::ModelConfig;

at::Tensor Longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }

// B rows of S tokens, each row the concatenation of documents of the given lengths; the
// documents themselves (for the reference), positions and labels as a packer makes them.
struct Packed {
  at::Tensor tokens, labels, positions;
  std::vector<rp::testing::ReferenceModel::Document> documents;
};

Packed Pack(const std::vector<std::vector<int64_t>>& rows, int64_t vocab, uint64_t seed) {
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t S = 0;
  for (int64_t n : rows[0]) S += n;
  Packed p;
  p.tokens = rp::testing::RandomTokens(B, S, vocab, seed);
  p.labels = at::full({B, S}, workers::models::kIgnoreIndex, at::kLong);
  p.positions = at::empty({B, S}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    int64_t at_ = 0;
    for (int64_t n : rows[static_cast<size_t>(b)]) {
      p.documents.push_back({p.tokens[b].narrow(0, at_, n).clone(), at::Tensor()});
      p.positions[b].narrow(0, at_, n).copy_(at::arange(n, at::kLong));
      if (n > 1) p.labels[b].narrow(0, at_, n - 1).copy_(p.tokens[b].narrow(0, at_ + 1, n - 1));
      at_ += n;
    }
    EXPECT_EQ(at_, S) << "row " << b << " must hold S tokens";
  }
  return p;
}

void ExpectPackedEqualsDocuments(int N, const planning::Partition& part, int M) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " M=" << M << " " << part.ToString());
  const spec::ModelConfig cfg = TinyLlama();
  workers::AdamWOptions adamw;
  adamw.lr = 1e-3;
  adamw.eps = 1e-6;  // see controller_test.cc
  adamw.max_grad_norm = 0.5;
  ControllerOptions o;
  o.partition = part;
  o.microbatches = M;
  o.adamw = adamw;
  o.head_chunk_tokens = 5;
  auto e = rp::testing::MakeRig(cfg, N, o, at::kFloat, 7);
  ASSERT_TRUE(e->controller);
  rp::testing::ReferenceModel ref(*e->store, adamw);
  // Rows of 12 tokens: documents of 1 to 12 tokens, a one-token document (no target) included.
  const std::vector<std::vector<std::vector<int64_t>>> batches = {
      {{5, 7}, {3, 3, 6}, {12}, {1, 4, 7}, {2, 10}, {6, 6}},
      {{4, 8}, {9, 3}, {2, 2, 2, 6}, {11, 1}, {12}, {7, 5}},
      {{3, 9}, {6, 6}, {1, 11}, {5, 5, 2}, {8, 4}, {12}},
  };
  for (size_t k = 0; k < batches.size(); ++k) {
    Packed p = Pack(batches[k], cfg.vocab, 500 + k);
    const double want = ref.StepDocuments(p.documents);
    auto got = e->controller->RunIteration(p.tokens, p.labels, p.positions);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NEAR(got->loss, want, 1e-5 * want) << "step " << k;
  }
  for (int i = 0; i < e->store->num_params(); ++i) {
    const workers::HostParam& hp = e->store->param(i);
    EXPECT_LT(rp::testing::RelativeError(hp.fp32, ref.param(hp.name)), 1e-5) << hp.name;
  }
  // The control: the same packed batch with attention across documents is another computation.
  Packed p = Pack(batches[0], cfg.vocab, 900);
  auto masked = e->controller->Evaluate(p.tokens, p.labels, p.positions);
  auto crossing = e->controller->Evaluate(p.tokens, p.labels);
  ASSERT_TRUE(masked.ok() && crossing.ok());
  EXPECT_GT(std::abs(masked->loss_sum - crossing->loss_sum), 1e-4 * masked->loss_sum);  // fp32 noise: ~1e-7
}

TEST(DocumentMasks, APackedBatchTrainsLikeItsDocumentsRunOneByOne) {
  ExpectPackedEqualsDocuments(1, {{}, 6, {}}, 1);
  ExpectPackedEqualsDocuments(3, {{2, 2}, 2, {1, 1, 2}}, 3);
  ExpectPackedEqualsDocuments(3, {{3, 1}, 2, {4}}, 6);
}

TEST(DocumentMasks, TheBlockSeesOnlyItsOwnDocument) {
  // One block, two documents in a row, against each document through the block on its own.
  const spec::ModelConfig cfg = TinyLlama();
  workers::HostModelStore store(cfg, at::kFloat, 3);
  std::vector<at::Tensor> w;
  for (int id : store.layer_params(1)) w.push_back(store.param(id).fp32);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor x = at::randn({1, 9, cfg.hidden}, gen, at::kFloat);
  at::Tensor positions = at::cat({at::arange(4, at::kLong), at::arange(5, at::kLong)}).reshape({1, 9});
  const auto cpu = c10::Device(c10::kCPU);
  at::Tensor packed = workers::models::BlockForward(
      cfg, 0, w, x, workers::models::DocumentLayout(workers::models::MakeRope(cfg, 9, cpu), positions));
  at::Tensor first =
      workers::models::BlockForward(cfg, 0, w, x.narrow(1, 0, 4), workers::models::MakeRope(cfg, 4, cpu));
  at::Tensor second =
      workers::models::BlockForward(cfg, 0, w, x.narrow(1, 4, 5), workers::models::MakeRope(cfg, 5, cpu));
  EXPECT_TRUE(at::allclose(packed.narrow(1, 0, 4), first, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(packed.narrow(1, 4, 5), second, 1e-5, 1e-6));
  at::Tensor plain = workers::models::BlockForward(cfg, 0, w, x, workers::models::MakeRope(cfg, 9, cpu));
  EXPECT_FALSE(at::allclose(plain.narrow(1, 4, 5), second, 1e-3, 1e-4));  // the mask matters
}

TEST(DocumentMasks, PositionsAreValidated) {
  const spec::ModelConfig cfg = TinyLlama();
  ControllerOptions o;
  o.partition = {{2, 2}, 2, {1, 1, 2}};
  o.microbatches = 2;
  auto e = rp::testing::MakeRig(cfg, 2, o);
  ASSERT_TRUE(e->controller);
  at::Tensor t = rp::testing::RandomTokens(2, 6, cfg.vocab, 1);
  at::Tensor good = Longs({0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 3}).reshape({2, 6});
  EXPECT_TRUE(e->controller->ValidateBatch(t, std::nullopt, good).ok());
  for (const at::Tensor& bad : {
           Longs({1, 2, 3, 0, 1, 2, 0, 1, 0, 1, 2, 3}).reshape({2, 6}),  // a row not at 0
           Longs({0, 1, 3, 0, 1, 2, 0, 1, 0, 1, 2, 3}).reshape({2, 6}),  // a jump
           Longs({0, 1, 2, 0, 1, 2}).reshape({1, 6}),                    // the wrong shape
       }) {
    const absl::Status st = e->controller->ValidateBatch(t, std::nullopt, bad);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("positions"), std::string::npos) << st;
  }
}

TEST(DocumentMasks, TheDatasetRestartsPositionsAndDropsTargetsAcrossDocuments) {
  // Documents [0..4) [4..5) [5..11) [11..16): windows of 5 + 1 tokens.
  std::vector<int32_t> tokens(16);
  for (int i = 0; i < 16; ++i) tokens[static_cast<size_t>(i)] = 10 + i;
  auto ds = runtime::TokenDataset::FromPacked(tokens, std::vector<uint8_t>(16, 1), 3, 5, "test");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_FALSE((*ds)->Positions(0).defined());  // plain concatenation: no positions
  (*ds)->MaskDocuments({0, 4, 5, 11});
  auto [t, l] = (*ds)->Batch(0);
  const at::Tensor pos = (*ds)->Positions(0);
  const auto I = workers::models::kIgnoreIndex;
  EXPECT_TRUE(at::equal(pos, Longs({0, 1, 2, 3, 0, /**/ 0, 1, 2, 3, 4, /**/ 0, 0, 1, 2, 3}).reshape({3, 5})));
  // Window 0: tokens 10..14; token 13 ends document 0 (no target), 14 is document 1 alone (its
  // target 15 starts document 2: dropped). Window 1 (15..19) continues into 20, all document 2.
  // Window 2 (20..24): 20 ends document 2 (its target 21 starts document 3), then 21..24 -> 22..25.
  EXPECT_TRUE(at::equal(l, Longs({11, 12, 13, I, I, /**/ 16, 17, 18, 19, 20, /**/ I, 22, 23, 24, 25}).reshape({3, 5})));
  EXPECT_EQ(t[2][0].item<int64_t>(), 20);
}

}  // namespace
}  // namespace rp::scheduler
