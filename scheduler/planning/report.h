// report.h — human and machine output of schedule comparisons and simulations: a text table,
// JSON, a terminal Gantt chart (in the spirit of the paper's Figure 1) and a Chrome/Perfetto
// trace (open in ui.perfetto.dev or chrome://tracing).
//
// Contract: pure functions returning strings; safe from any thread.
#pragma once

#include <string>
#include <vector>

#include "scheduler/planning/comparison.h"

namespace rp::planning {

std::string FormatComparisonTable(const std::vector<ComparisonRow>& rows);
// A fraction as the percentage the tables print with two decimals: steady-state differences of
// -1e-17 and the like come out as 0.00, never "-0.00".
double TablePercent(double fraction);
std::string ComparisonJson(const std::vector<ComparisonRow>& rows);

// One line per GPU worker, `width` cells over [0, makespan]. Cell glyphs: forward slot/stage
// k -> digit k mod 10; fused B_1 -> '*'; backward -> letter ('a' + k mod 26); parameter uploads
// are not drawn; idle -> '.'. Odd iterations use upper-case letters and '#' for the fused stage
// so iteration boundaries stay visible.
std::string GanttChart(const SimSchedule& schedule, const SimResult& result, int width);

// Chrome trace-event JSON (microseconds), one track per resource.
std::string ChromeTrace(const SimSchedule& schedule, const SimResult& result);

}  // namespace rp::planning
