#include "workers/device/timeline.h"

#include <nlohmann/json.hpp>

namespace rp::workers {

void Timeline::Add(TimelineEntry e) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(std::move(e));
}

std::vector<TimelineEntry> Timeline::Entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

void Timeline::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

std::string Timeline::ChromeTrace() const {
  nlohmann::json events = nlohmann::json::array();
  for (const TimelineEntry& e : Entries()) {
    events.push_back({{"name", e.label},
                      {"cat", e.stream},
                      {"ph", "X"},
                      {"pid", e.worker},
                      {"tid", e.stream},
                      {"ts", e.start_s * 1e6},
                      {"dur", (e.end_s - e.start_s) * 1e6},
                      {"args", {{"iteration", e.iteration}, {"slot", e.slot}, {"microbatch", e.microbatch}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace rp::workers
