#include "workers/device/timeline.h"

#include <nlohmann/json.hpp>

namespace rp::workers {

void Timeline::Add(TimelineEntry e) {
  base::MutexLock lock(&mu_);
  entries_.push_back(std::move(e));
  while (entries_.size() > max_entries_) entries_.pop_front();
}

std::vector<TimelineEntry> Timeline::Entries() const {
  base::MutexLock lock(&mu_);
  return {entries_.begin(), entries_.end()};
}

std::vector<TimelineEntry> Timeline::EntriesEndingSince(double t) const {
  base::MutexLock lock(&mu_);
  auto it = entries_.end();
  // Appends from several threads are only roughly ordered by end time: keep scanning past a
  // small disorder window.
  int older_in_a_row = 0;
  while (it != entries_.begin() && older_in_a_row < 64) {
    --it;
    older_in_a_row = it->end_s < t ? older_in_a_row + 1 : 0;
  }
  std::vector<TimelineEntry> out;
  for (; it != entries_.end(); ++it) {
    if (it->end_s >= t) out.push_back(*it);
  }
  return out;
}

void Timeline::Clear() {
  base::MutexLock lock(&mu_);
  entries_.clear();
}

std::string Timeline::ChromeTrace() const {
  nlohmann::json events = nlohmann::json::array();
  for (const TimelineEntry& e : Entries()) {
    events.push_back(
        {{"name", e.label},
         {"cat", e.stream},
         {"ph", "X"},
         {"pid", e.worker},
         {"tid", e.job >= 0 ? e.stream + " job " + std::to_string(e.job) : e.stream},
         {"ts", e.start_s * 1e6},
         {"dur", (e.end_s - e.start_s) * 1e6},
         {"args", {{"iteration", e.iteration}, {"slot", e.slot}, {"microbatch", e.microbatch}, {"job", e.job}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace rp::workers
