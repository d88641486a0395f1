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

}  // namespace rp::server
