// The text loss curve of `roundpipe watch` (client/loss_chart.h), read back dot by dot: every dot
// column of a series with one point per column holds the dot the value maps to, evaluations are
// diamonds in their cells, the axes carry the range and the steps.
#include "client/loss_chart.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace rp::client {
namespace {

// The dots of a rendered plot row, decoded: dots[x][dy] for every dot column x (two per cell).
// Non-braille cells (spaces, diamonds) have no dots. The row starts after the axis "┤".
std::vector<std::vector<bool>> DecodeRow(const std::string& row) {
  const std::string axis = "\xE2\x94\xA4";
  size_t at = row.find(axis);
  EXPECT_NE(at, std::string::npos) << row;
  at += axis.size();
  std::vector<std::vector<bool>> dots;
  static constexpr int kBits[2][4] = {{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}};
  while (at < row.size()) {
    const auto b0 = static_cast<unsigned char>(row[at]);
    int cp = b0;
    size_t len = 1;
    if (b0 >= 0xE0) {
      cp = ((b0 & 0x0F) << 12) | ((static_cast<unsigned char>(row[at + 1]) & 0x3F) << 6) |
           (static_cast<unsigned char>(row[at + 2]) & 0x3F);
      len = 3;
    }
    const int bits = cp >= 0x2800 && cp <= 0x28FF ? cp - 0x2800 : 0;
    for (int dx = 0; dx < 2; ++dx) {
      std::vector<bool> col(4);
      for (int dy = 0; dy < 4; ++dy) col[static_cast<size_t>(dy)] = (bits & kBits[dx][dy]) != 0;
      dots.push_back(col);
    }
    at += len;
  }
  return dots;
}

TEST(LossChart, EachDotColumnHoldsTheDotItsValueMapsTo) {
  ChartOptions o;
  o.width = 20;
  o.height = 5;
  // One point per dot column (40), a falling curve with a bump: y in [1, 3].
  std::vector<ChartPoint> train;
  for (int i = 0; i < 40; ++i) train.push_back({i + 1, 3.0 - 2.0 * i / 39 + (i == 20 ? 0.5 : 0)});
  const std::vector<std::string> lines = RenderLossChart(train, {}, o);
  ASSERT_EQ(lines.size(), 1u + 5 + 2);  // legend, rows, axis, labels
  // Decode the 5 x 4 dot grid; the reference row of each value, computed here on its own.
  const double lo = 1.0, hi = 3.0;  // the bump (2.47 at column 20) stays inside
  std::vector<std::vector<bool>> grid(40, std::vector<bool>(20));
  for (int r = 0; r < 5; ++r) {
    const auto row = DecodeRow(lines[static_cast<size_t>(1 + r)]);
    ASSERT_EQ(row.size(), 40u) << lines[static_cast<size_t>(1 + r)];
    for (int x = 0; x < 40; ++x) {
      for (int dy = 0; dy < 4; ++dy)
        grid[static_cast<size_t>(x)][static_cast<size_t>(4 * r + dy)] =
            row[static_cast<size_t>(x)][static_cast<size_t>(dy)];
    }
  }
  int prev = -1;
  for (int x = 0; x < 40; ++x) {
    const int want = static_cast<int>(std::lround((1 - (train[static_cast<size_t>(x)].value - lo) / (hi - lo)) * 19));
    // The dot itself, and the vertical run joining it to the previous column's: nothing else.
    const int from = prev < 0 ? want : std::min(prev, want), to = prev < 0 ? want : std::max(prev, want);
    for (int y = 0; y < 20; ++y) {
      EXPECT_EQ(grid[static_cast<size_t>(x)][static_cast<size_t>(y)], y >= from && y <= to)
          << "column " << x << " dot row " << y;
    }
    prev = want;
  }
  EXPECT_NE(lines[1].find(" 3 "), std::string::npos) << lines[1];  // the top of the range
  EXPECT_NE(lines[5].find(" 1 "), std::string::npos) << lines[5];  // its bottom
  EXPECT_NE(lines.back().find("step 1"), std::string::npos);
  EXPECT_NE(lines.back().find("40"), std::string::npos);
  for (const std::string& l : lines) EXPECT_EQ(l.find('\x1b'), std::string::npos) << "colour without asking";
}

TEST(LossChart, EvaluationsAreDiamondsInTheirCells) {
  ChartOptions o;
  o.width = 10;
  o.height = 4;
  const std::vector<ChartPoint> train = {{1, 4.0}, {10, 1.0}};
  const std::vector<ChartPoint> eval = {{10, 4.0}};  // top right
  const auto lines = RenderLossChart(train, eval, o);
  const std::string diamond = "\xE2\x97\x86";
  const std::string top = lines[1];
  ASSERT_NE(top.rfind(diamond), std::string::npos) << top;
  EXPECT_EQ(top.substr(top.size() - diamond.size()), diamond) << "the last cell of the top row";
  for (size_t r = 2; r <= 4; ++r) EXPECT_EQ(lines[r].find(diamond), std::string::npos) << lines[r];
}

TEST(LossChart, NonFiniteValuesAreLeftOutAndManyPointsFit) {
  ChartOptions o;
  o.width = 30;
  EXPECT_TRUE(RenderLossChart({{1, NAN}, {2, INFINITY}}, {}, o).empty());
  std::vector<ChartPoint> many;
  for (int i = 0; i < 1000000; ++i) many.push_back({i, 2.0 + std::sin(i * 1e-4)});
  many.push_back({1000000, NAN});
  const auto lines = RenderLossChart(many, {}, o);
  ASSERT_EQ(lines.size(), 1u + 10 + 2);
  for (size_t r = 1; r <= 10; ++r) EXPECT_EQ(DecodeRow(lines[r]).size(), 60u) << lines[r];
  o.color = true;
  EXPECT_NE(RenderLossChart(many, {}, o)[3].find("\x1b[36m"), std::string::npos);
}

}  // namespace
}  // namespace rp::client
