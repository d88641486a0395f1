// A client's streamed batch checked and converted once (stream_batch.h): every shape mistake is
// an InvalidArgument naming the field, and a loss mask becomes the engine's ignore labels.
#include "server/stream_batch.h"

#include <gtest/gtest.h>

namespace rp::server {
namespace {

roundpipe::v1::Batch Make(int64_t rows, int64_t cols, int tokens, int mask = 0) {
  roundpipe::v1::Batch b;
  b.set_batch(rows);
  b.set_sequence(cols);
  for (int i = 0; i < tokens; ++i) b.add_tokens(10 + i);
  for (int i = 0; i < mask; ++i) b.add_loss_mask(i % 3 != 0);
  return b;
}

void ExpectRejected(const roundpipe::v1::Batch& b, const std::string& names) {
  auto r = ToEngineBatch(b, 2, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(names), std::string::npos) << r.status();
}

TEST(ToEngineBatch, EveryShapeMistakeIsRefusedNamingWhatToFix) {
  ExpectRejected(Make(3, 3, 9), "shape 3 x 3 does not match the job's global_batch x sequence_length = 2 x 3");
  ExpectRejected(Make(2, 4, 8), "shape 2 x 4");
  ExpectRejected(Make(2, 3, 5), "5 token ids for a 2 x 3 batch (expected 6)");
  ExpectRejected(Make(2, 3, 7), "7 token ids");
  ExpectRejected(Make(2, 3, 6, 5), "loss_mask has 5 entries, expected 0 or 6");
  ExpectRejected(Make(-2, 3, 0), "shape -2 x 3");
}

TEST(ToEngineBatch, TokensAreCopiedAndAMaskBecomesIgnoreLabels) {
  auto plain = ToEngineBatch(Make(2, 3, 6), 2, 3);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->rows, 2);
  EXPECT_EQ(plain->cols, 3);
  EXPECT_EQ(plain->tokens, (std::vector<int32_t>{10, 11, 12, 13, 14, 15}));
  EXPECT_TRUE(plain->labels.empty());  // the engine shifts the tokens itself
  // Mask (row-major) F T T | F T T: position i predicts token i+1 of its row when mask[i]; the
  // last position of each row has no next token.
  auto masked = ToEngineBatch(Make(2, 3, 6, 6), 2, 3);
  ASSERT_TRUE(masked.ok()) << masked.status();
  constexpr int32_t kIgnore = scheduler::Batch::kIgnoreLabel;
  EXPECT_EQ(masked->labels, (std::vector<int32_t>{kIgnore, 12, kIgnore, kIgnore, 15, kIgnore}));
}

}  // namespace
}  // namespace rp::server
