// timeline.h — records when every device operation ran (worker, stream, label, start, end) and
// exports a Chrome/Perfetto trace of a real run.
//
// Contract: thread-safe (one mutex); streams append from their own threads. Times are seconds
// since the Timeline was created (steady clock). Bounded: beyond `max_entries` the oldest entries
// are dropped, so a long-running engine does not grow without limit.
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <vector>
#include "workers/base/mutex.h"

namespace rp::workers {

struct TimelineEntry {
  int worker = 0;
  std::string stream;
  std::string label;  // e.g. "F s0 mb3", "B1 mb0", "up params s2"
  int iteration = -1;
  int slot = -1;  // stage slot index in the dispatch plan (-1: not a slot op)
  int microbatch = -1;
  double start_s = 0, end_s = 0;
  int job = -1;  // the job whose lane ran it (lane_device.h); -1: a device's own stream
};

class Timeline {
 public:
  explicit Timeline(size_t max_entries = size_t{1} << 18)
      : origin_(std::chrono::steady_clock::now()), max_entries_(max_entries) {}
  double Now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count(); }
  void Add(TimelineEntry e);
  std::vector<TimelineEntry> Entries() const;
  // Entries that ended at or after `t` (entries are appended when they end, so this scans only
  // the recent tail).
  std::vector<TimelineEntry> EntriesEndingSince(double t) const;
  void Clear();
  // Chrome trace-event JSON: one process per worker, one track per stream.
  std::string ChromeTrace() const;

 private:
  const std::chrono::steady_clock::time_point origin_;
  mutable base::Mutex mu_;
  const size_t max_entries_;
  std::deque<TimelineEntry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rp::workers
