// heap_policy.h — glibc heap settings for a long-running daemon whose jobs come and go.
//
// Why: glibc raises its mmap threshold (up to 32 MiB) after a large block is freed and, with it,
// its trim threshold to twice that (64 MiB). A thread arena's heap is at most 64 MiB, so once
// raised, a thread arena never gives back the free top of its heap: neither free() nor
// malloc_trim() (which trims only the main arena's top) does. The tokenizing threads of a JSONL
// job each kept up to 63 MiB resident after the job ended (measured: a daemon's RSS rose
// 448 -> 685 MiB over eight 16 MB JSONL jobs, then stayed; with these settings 416 -> 417 MiB).
//
// How: fixes both thresholds at process start (which also turns glibc's adjustment off): blocks
// of kMmapThresholdBytes and more are mapped and unmapped on their own (the size glibc's
// adjustment reaches for tensors anyway), and any arena trims a free top above
// kTrimThresholdBytes. Call once from main() before threads start; not thread-safe with
// concurrent allocation-heavy threads (mallopt takes the arena locks, but call it first).
#pragma once

#include <cstddef>

namespace rp::process {

inline constexpr std::size_t kMmapThresholdBytes = std::size_t{32} << 20;  // 32 MiB
inline constexpr std::size_t kTrimThresholdBytes = std::size_t{8} << 20;   // 8 MiB

// Applies both settings; false when glibc refused one (the daemon runs on, logging it).
bool ApplyDaemonHeapPolicy();

}  // namespace rp::process
