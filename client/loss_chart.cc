// A loss curve in braille characters (loss_chart.h).
#include "client/loss_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rp::client {
namespace {

// The bit of dot (dx, dy) within a braille cell (dx 0..1 left to right, dy 0..3 top to bottom).
int DotBit(int dx, int dy) {
  static constexpr int kBits[2][4] = {{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}};
  return kBits[dx][dy];
}

// UTF-8 of the braille character with `bits` raised (U+2800 + bits).
std::string Braille(int bits) {
  const int cp = 0x2800 + bits;
  std::string s;
  s += static_cast<char>(0xE0 | (cp >> 12));
  s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void Add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

std::string Label(double v) {
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e5 || a < 1e-3)) return absl::StrFormat("%.2e", v);
  return absl::StrFormat("%.4g", v);
}

// The train line on a (2 width) x (4 height) dot grid: one mean value per dot column that has
// points, straight segments between them.
void DrawLine(const std::vector<ChartPoint>& train, const Range& steps, const Range& values, int dots_x, int dots_y,
              std::vector<std::vector<int>>* cells) {
  std::vector<double> sum(static_cast<size_t>(dots_x), 0);
  std::vector<int> count(static_cast<size_t>(dots_x), 0);
  const double span_x = std::max(1.0, steps.hi - steps.lo);
  for (const ChartPoint& p : train) {
    if (!std::isfinite(p.value)) continue;
    const int x = std::clamp(
        static_cast<int>(std::lround((static_cast<double>(p.step) - steps.lo) / span_x * (dots_x - 1))), 0, dots_x - 1);
    sum[static_cast<size_t>(x)] += p.value;
    ++count[static_cast<size_t>(x)];
  }
  auto row_of = [&](double v) {
    const double f = (v - values.lo) / (values.hi - values.lo);
    return std::clamp(static_cast<int>(std::lround((1 - f) * (dots_y - 1))), 0, dots_y - 1);
  };
  auto dot = [&](int x, int y) {
    (*cells)[static_cast<size_t>(y / 4)][static_cast<size_t>(x / 2)] |= DotBit(x % 2, y % 4);
  };
  // Columns between two points get the straight line's rows; each column's run joins it to the
  // previous column's row, so the line has no gaps.
  int prev_x = -1, prev_y = -1;
  for (int x = 0; x < dots_x; ++x) {
    if (count[static_cast<size_t>(x)] == 0) continue;
    const int y = row_of(sum[static_cast<size_t>(x)] / count[static_cast<size_t>(x)]);
    if (prev_x < 0) {
      dot(x, y);
    } else {
      int last = prev_y;
      for (int xi = prev_x + 1; xi <= x; ++xi) {
        const int yi =
            static_cast<int>(std::lround(prev_y + static_cast<double>(y - prev_y) * (xi - prev_x) / (x - prev_x)));
        for (int yy = std::min(last, yi); yy <= std::max(last, yi); ++yy) dot(xi, yy);
        last = yi;
      }
    }
    prev_x = x;
    prev_y = y;
  }
}

}  // namespace

std::vector<std::string> RenderLossChart(const std::vector<ChartPoint>& train, const std::vector<ChartPoint>& eval,
                                         const ChartOptions& o) {
  const int width = std::clamp(o.width, 8, 400), height = std::clamp(o.height, 2, 200);
  Range steps, values;
  for (const auto* series : {&train, &eval}) {
    for (const ChartPoint& p : *series) {
      if (!std::isfinite(p.value)) continue;
      steps.Add(static_cast<double>(p.step));
      values.Add(p.value);
    }
  }
  if (values.empty()) return {};
  if (values.hi - values.lo < 1e-12) {
    values.lo -= 0.5;
    values.hi += 0.5;
  }
  std::vector<std::vector<int>> cells(static_cast<size_t>(height), std::vector<int>(static_cast<size_t>(width), 0));
  DrawLine(train, steps, values, 2 * width, 4 * height, &cells);
  // Evaluations: a diamond in the cell of each, over the line.
  std::vector<std::vector<bool>> marks(static_cast<size_t>(height),
                                       std::vector<bool>(static_cast<size_t>(width), false));
  const double span_x = std::max(1.0, steps.hi - steps.lo);
  for (const ChartPoint& p : eval) {
    if (!std::isfinite(p.value)) continue;
    const int col = std::clamp(
        static_cast<int>(std::lround((static_cast<double>(p.step) - steps.lo) / span_x * (width - 1))), 0, width - 1);
    const double f = (p.value - values.lo) / (values.hi - values.lo);
    const int row = std::clamp(static_cast<int>(std::lround((1 - f) * (height - 1))), 0, height - 1);
    marks[static_cast<size_t>(row)][static_cast<size_t>(col)] = true;
  }
  const std::string cyan = o.color ? "\x1b[36m" : "", yellow = o.color ? "\x1b[33m" : "",
                    reset = o.color ? "\x1b[0m" : "";
  const int gutter = 10;
  std::vector<std::string> lines;
  lines.push_back(absl::StrCat(std::string(gutter, ' '), cyan, Braille(0x12), Braille(0x12), reset, " train loss   ",
                               yellow, "\xE2\x97\x86", reset, " eval loss"));
  for (int r = 0; r < height; ++r) {
    std::string label;
    if (r == 0) label = Label(values.hi);
    if (r == height - 1) label = Label(values.lo);
    if (r == height / 2 && height > 2) label = Label((values.hi + values.lo) / 2);
    std::string line = absl::StrFormat("%*s \xE2\x94\xA4", gutter - 2, label);  // "┤"
    bool in_cyan = false;
    for (int c = 0; c < width; ++c) {
      if (marks[static_cast<size_t>(r)][static_cast<size_t>(c)]) {
        absl::StrAppend(&line, in_cyan ? reset : "", yellow, "\xE2\x97\x86", reset);  // "◆"
        in_cyan = false;
        continue;
      }
      const int bits = cells[static_cast<size_t>(r)][static_cast<size_t>(c)];
      if (bits != 0 && !in_cyan) {
        line += cyan;
        in_cyan = o.color;
      }
      line += bits != 0 ? Braille(bits) : " ";
    }
    if (in_cyan) line += reset;
    lines.push_back(std::move(line));
  }
  std::string axis = std::string(gutter - 1, ' ') + "\xE2\x94\x94";  // "└"
  for (int c = 0; c < width; ++c) axis += "\xE2\x94\x80";            // "─"
  lines.push_back(std::move(axis));
  const std::string first = absl::StrCat("step ", static_cast<int64_t>(steps.lo)),
                    last = absl::StrCat(static_cast<int64_t>(steps.hi));
  const int pad = std::max(1, width - static_cast<int>(first.size()) - static_cast<int>(last.size()));
  lines.push_back(absl::StrCat(std::string(gutter, ' '), first, std::string(static_cast<size_t>(pad), ' '), last));
  return lines;
}

}  // namespace rp::client
