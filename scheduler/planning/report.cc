#include "scheduler/planning/report.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace rp::planning {

double TablePercent(double fraction) {
  const double p = 100 * fraction;
  return p > -0.005 && p < 0.005 ? 0.0 : p;
}

std::string FormatComparisonTable(const std::vector<ComparisonRow>& rows) {
  std::string out = absl::StrFormat("%-22s %6s %9s %10s %8s %10s %10s %10s %8s\n", "schedule", "stages", "t_max ms",
                                    "iter ms", "bubble%", "filldrain%", "imbalance%", "optimizer%", "speed");
  const double ref = rows.empty() ? 0 : rows.front().bubbles.period_s;
  for (const ComparisonRow& r : rows) {
    const BubbleBreakdown& b = r.bubbles;
    absl::StrAppendFormat(&out, "%-22s %6d %9.3f %10.2f %8.2f %10.2f %10.2f %10.2f %7.2fx\n", r.schedule, r.stages,
                          r.t_max_s * 1e3, b.period_s * 1e3, TablePercent(b.total), TablePercent(b.fill_drain),
                          TablePercent(b.imbalance), TablePercent(b.optimizer),
                          b.period_s > 0 ? ref / b.period_s : 0.0);
  }
  return out;
}

std::string ComparisonJson(const std::vector<ComparisonRow>& rows) {
  nlohmann::json arr = nlohmann::json::array();
  for (const ComparisonRow& r : rows) {
    arr.push_back({{"schedule", r.schedule},
                   {"stages", r.stages},
                   {"partition", r.partition},
                   {"t_max_s", r.t_max_s},
                   {"iteration_s", r.bubbles.period_s},
                   {"bubble_ratio", r.bubbles.total},
                   {"fill_drain_ratio", r.bubbles.fill_drain},
                   {"imbalance_ratio", r.bubbles.imbalance},
                   {"optimizer_ratio", r.bubbles.optimizer},
                   {"makespan_s", r.result.makespan},
                   {"worker_busy_s",
                    std::vector<double>(r.result.busy.begin(), r.result.busy.begin() + r.schedule_data.num_workers)}});
  }
  return arr.dump(2);
}

std::string GanttChart(const SimSchedule& s, const SimResult& r, int width) {
  width = std::max(10, width);
  std::string out;
  const double span = r.makespan > 0 ? r.makespan : 1;
  for (int w = 0; w < s.num_workers; ++w) {
    std::string line(static_cast<size_t>(width), '.');
    for (int t : s.order[static_cast<size_t>(w)]) {
      const SimTask& task = s.tasks[static_cast<size_t>(t)];
      if (task.duration_s <= 0) continue;
      const bool odd = task.iteration % 2 == 1;
      char g;
      switch (task.phase) {
        case TaskPhase::kForward:
          g = static_cast<char>('0' + task.stage % 10);
          break;
        case TaskPhase::kFused:
          g = odd ? '#' : '*';
          break;
        case TaskPhase::kBackward:
          g = static_cast<char>((odd ? 'A' : 'a') + task.stage % 26);
          break;
        default:
          continue;
      }
      // Paint every cell whose midpoint lies inside the task.
      const double t0 = r.start[static_cast<size_t>(t)], t1 = r.finish[static_cast<size_t>(t)];
      for (int c = std::max(0, static_cast<int>(t0 / span * width) - 1); c < width; ++c) {
        const double mid = (c + 0.5) * span / width;
        if (mid >= t1) break;
        if (mid >= t0) line[static_cast<size_t>(c)] = g;
      }
    }
    absl::StrAppendFormat(&out, "%-6s |%s|\n",
                          s.resource_names.size() > static_cast<size_t>(w) ? s.resource_names[static_cast<size_t>(w)]
                                                                           : absl::StrCat("gpu", w),
                          line);
  }
  absl::StrAppendFormat(&out, "%-6s  0%*s\n", "", width, absl::StrFormat("%.2f ms", span * 1e3));
  return out;
}

std::string ChromeTrace(const SimSchedule& s, const SimResult& r) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t res = 0; res < s.resource_names.size(); ++res) {
    events.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", res}, {"args", {{"name", s.resource_names[res]}}}});
  }
  for (size_t t = 0; t < s.tasks.size(); ++t) {
    const SimTask& task = s.tasks[t];
    std::string name;
    std::string cat;
    switch (task.phase) {
      case TaskPhase::kForward:
        name = absl::StrCat("F s", task.stage, " mb", task.microbatch);
        cat = "forward";
        break;
      case TaskPhase::kFused:
        name = absl::StrCat("B1 mb", task.microbatch);
        cat = "fused";
        break;
      case TaskPhase::kBackward:
        name = absl::StrCat("B s", task.stage, " mb", task.microbatch);
        cat = "backward";
        break;
      case TaskPhase::kOptimizer:
        name = task.layer >= 0 ? absl::StrCat("step L", task.layer) : "step";
        cat = "optimizer";
        break;
      case TaskPhase::kParamUpload:
        name = absl::StrCat("upload s", task.stage);
        cat = "transfer";
        break;
      case TaskPhase::kGradDownload:
        name = absl::StrCat("grads s", task.stage);
        cat = "transfer";
        break;
    }
    events.push_back({{"name", name},
                      {"cat", cat},
                      {"ph", "X"},
                      {"pid", 1},
                      {"tid", task.resource},
                      {"ts", r.start[t] * 1e6},
                      {"dur", task.duration_s * 1e6},
                      {"args", {{"iteration", task.iteration}, {"microbatch", task.microbatch}}}});
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  return doc.dump();
}

}  // namespace rp::planning
