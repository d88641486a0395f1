#include "workers/device/transfer_windows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace rp::workers {
namespace {

TEST(TransferWindows, CoversEveryByteOnceAndBalances) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<TensorExtent> t;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) {
      // Mostly small tensors, sometimes a huge one (an LM head).
      const int64_t b = rng() % 7 == 0 ? 1 + static_cast<int64_t>(rng() % 100000) : static_cast<int64_t>(rng() % 3000);
      t.push_back({"t" + std::to_string(i), b});
    }
    const int windows = 1 + static_cast<int>(rng() % 8);
    const int64_t threshold = trial % 3 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 5000);
    auto w = PlanTransferWindows(t, windows, threshold);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_EQ(w->windows.size(), static_cast<size_t>(windows));
    // Every tensor's bytes are covered exactly once by its pieces.
    std::vector<std::vector<std::pair<int64_t, int64_t>>> spans(t.size());
    for (size_t k = 0; k < w->windows.size(); ++k) {
      int64_t sum = 0;
      for (const TransferPiece& p : w->windows[k]) {
        spans[static_cast<size_t>(p.tensor)].push_back({p.offset, p.bytes});
        sum += p.bytes;
        if (threshold > 0) {
          EXPECT_LE(p.bytes, threshold);
        }
      }
      EXPECT_EQ(sum, w->window_bytes[k]);
    }
    for (size_t i = 0; i < t.size(); ++i) {
      std::sort(spans[i].begin(), spans[i].end());
      int64_t at = 0;
      for (auto [off, len] : spans[i]) {
        EXPECT_EQ(off, at);
        EXPECT_GT(len, 0);
        at += len;
      }
      EXPECT_EQ(at, t[i].bytes);
    }
    // LPT bound: the fullest window exceeds the emptiest by at most one piece.
    const auto [mn, mx] = std::minmax_element(w->window_bytes.begin(), w->window_bytes.end());
    EXPECT_LE(*mx - *mn, w->max_piece_bytes) << "trial " << trial;
  }
}

TEST(TransferWindows, SplitsLargeTensorsFirst) {
  // An LM head 8x the size of the rest: without splitting one window would carry it all.
  std::vector<TensorExtent> t = {{"lm_head", 800}, {"a", 50}, {"b", 50}};
  auto w = *PlanTransferWindows(t, 4, 0);  // threshold = ceil(900 / 4) = 225
  EXPECT_LE(w.max_piece_bytes, 225);
  const auto [mn, mx] = std::minmax_element(w.window_bytes.begin(), w.window_bytes.end());
  EXPECT_LE(*mx, 250);
  EXPECT_GE(*mn, 200);
}

TEST(TransferWindows, Errors) {
  EXPECT_FALSE(PlanTransferWindows({{"x", 10}}, 0).ok());
  EXPECT_FALSE(PlanTransferWindows({{"x", -1}}, 2).ok());
  EXPECT_FALSE(PlanTransferWindows({{"x", 10}}, 2, -5).ok());
  auto empty = PlanTransferWindows({}, 3);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->window_bytes, (std::vector<int64_t>{0, 0, 0}));
}

}  // namespace
}  // namespace rp::workers
