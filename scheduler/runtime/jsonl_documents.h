// jsonl_documents.h — (runtime) a JSON Lines dataset read into one packed token stream with a loss
// mask: the documents ({"text"} or {"prompt", "completion"}; see TokenFileSource::kJsonl) encoded
// with a tokenizer.json tokenizer (workers/text) and concatenated in file order.
//
// Contract: reads through the daemon's confinement (a regular file beneath its roots). Every
// failure names the file and, for a record, its line and field; a dataset that cannot be read
// whole is refused whole (a job never starts on part of it). Called by the job builder on the
// runner's thread (never a gRPC thread); tokenizes on up to 8 short-lived threads of its own
// (one per 256 records, at most one per core), with a result identical to one sequential pass.
// Every record is bounded (JsonlLimits): stoppable at once, and by a time budget.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/runtime/token_dataset.h"
#include "workers/text/tokenizer.h"

namespace rp::scheduler::runtime {

// A tokenizer directory: tokenizer.json, and the end-of-sequence token to append after every
// document: `eos_token` when non-empty, else tokenizer_config.json's "eos_token" when present.
// At most two are held at once in the process (a parse and a loaded vocabulary cost about ten
// times the file): LoadTokenizerDir waits for a permit, which the value holds until destroyed;
// concurrent Submits cannot multiply that peak.
struct LoadedTokenizer {
  std::shared_ptr<void> permit;  // first: released (and freed memory trimmed) after the tokenizer
  workers::text::Tokenizer tokenizer;
  std::optional<int32_t> eos_id;
};
absl::StatusOr<LoadedTokenizer> LoadTokenizerDir(const std::string& dir, const std::string& eos_token);

// A parse of tokenizer.json peaks at about this many times the file's bytes (measured: a 16 MB,
// 1M-entry vocabulary adds 267 MiB to the peak resident set).
inline constexpr int64_t kTokenizerParsePeakFactor = 20;
// What the tokenizer parses running now may still take: kTokenizerParsePeakFactor x the bytes
// of each file being parsed (at most two: the permits). Host-memory admission subtracts it.
int64_t TokenizerParseBytesInFlight();

// What bounds the read: `stop`, raised by another thread (the job's cancel, pause, a drain), ends
// it with Cancelled within one regex call; each record may take max(min_record_seconds, its bytes
// / min_bytes_per_second) — honest text tokenizes at several MB/s, a backtracking pre-tokenizer
// pattern at KB/s — past which the read fails naming the file and line.
// `progress` (optional) is told the records tokenized so far and the records in all, every
// `progress_every` while the read runs (from the calling thread).
struct JsonlLimits {
  const std::atomic<bool>* stop = nullptr;
  double min_bytes_per_second = 256.0 * 1024;
  double min_record_seconds = 5;
  std::function<void(int64_t done, int64_t records)> progress;
  std::chrono::milliseconds progress_every{5000};
};

absl::StatusOr<PackedTokens> ReadJsonlDocuments(const std::string& path, const LoadedTokenizer& tok,
                                                const JsonlLimits& limits = {});

}  // namespace rp::scheduler::runtime
