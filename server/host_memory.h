// host_memory.h — how much host memory a new job may take, read when the job is admitted (never
// sampled once at start: page cache and other jobs come and go).
//
// Contract: pure functions over /proc, any thread.
#pragma once

#include <cstdint>
#include <string>

namespace rp::server {

// MemAvailable from a /proc/meminfo text, in bytes; -1 when absent or malformed.
int64_t ParseMemAvailable(const std::string& meminfo_text);

// 3/4 of MemAvailable now (falls back to free pages when /proc/meminfo cannot be read).
int64_t HostMemoryBudgetNow();

// What admission may promise a new job: `budget_now` (HostMemoryBudgetNow), plus 3/4 of the model
// states running jobs hold (`held_by_jobs`: they give it back when they end), less what parses in
// flight may still take (`parses_in_flight`, not resident yet). Never below 0.
int64_t AdmissionBudget(int64_t budget_now, int64_t held_by_jobs, int64_t parses_in_flight);

}  // namespace rp::server
