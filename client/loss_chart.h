// loss_chart.h — a loss curve drawn with text, for `roundpipe watch` in a terminal: the train
// loss as a line of Unicode braille dots (2 x 4 dots per character cell), each evaluation as a
// diamond, a y axis labelled with the range and an x axis with the first and last step.
//
// Contract: a pure function of its inputs (no terminal I/O); any thread. Non-finite values are
// left out; any number of points (they are averaged per dot column).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rp::client {

struct ChartPoint {
  int64_t step = 0;
  double value = 0;
};

struct ChartOptions {
  int width = 60;      // plot columns (character cells), the axis gutter not included
  int height = 10;     // plot rows
  bool color = false;  // ANSI colours: the train line cyan, evaluations yellow
};

// Lines to print, top to bottom: a legend, `height` plot rows with the y axis, the x axis and its
// step labels. Empty when no point is finite.
std::vector<std::string> RenderLossChart(const std::vector<ChartPoint>& train, const std::vector<ChartPoint>& eval,
                                         const ChartOptions& options);

}  // namespace rp::client
