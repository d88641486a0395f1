// timeline.h — records when every device operation ran (worker, stream, label, start, end) and
// exports a Chrome/Perfetto trace of a real run.
//
// Contract: thread-safe (one mutex); streams append from their own threads. Times are seconds
// since the Timeline was created (steady clock).
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace rp::workers {

struct TimelineEntry {
  int worker = 0;
  std::string stream;
  std::string label;  // e.g. "F s0 mb3", "B1 mb0", "up params s2"
  int iteration = -1;
  int slot = -1;  // stage slot index in the dispatch plan (-1: not a slot op)
  int microbatch = -1;
  double start_s = 0, end_s = 0;
};

class Timeline {
 public:
  Timeline() : origin_(std::chrono::steady_clock::now()) {}
  double Now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count(); }
  void Add(TimelineEntry e);
  std::vector<TimelineEntry> Entries() const;
  void Clear();
  // Chrome trace-event JSON: one process per worker, one track per stream.
  std::string ChromeTrace() const;

 private:
  const std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<TimelineEntry> entries_;
};

}  // namespace rp::workers
