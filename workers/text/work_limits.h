// work_limits.h — what bounds one piece of tokenizing work: a flag another thread raises to stop
// it (the job's cancel, pause or a daemon drain) and a deadline (a per-record budget, so a
// backtracking pre-tokenizer pattern cannot hold a job for minutes). Checked between regex
// matches and between pieces: a stop is seen within one PCRE2 call (bounded by its match limit).
//
// Contract: a value type; Check() is const and safe from any thread (the flag is atomic).
#pragma once

#include <atomic>
#include <chrono>

#include "absl/status/status.h"

namespace rp::workers::text {

struct WorkLimits {
  const std::atomic<bool>* stop = nullptr;  // raised: the work ends with Cancelled
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();

  // OK while the work may go on; Cancelled once `stop` is raised; DeadlineExceeded past the
  // deadline. The messages are short: the caller names the file and record.
  absl::Status Check() const {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) return absl::CancelledError("stopped");
    if (deadline != std::chrono::steady_clock::time_point::max() && std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError("ran past its time budget");
    }
    return absl::OkStatus();
  }
};

}  // namespace rp::workers::text
