#include "scheduler/runtime/jsonl_documents.h"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <semaphore>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "workers/files/bounded_json.h"
#include "workers/files/confined_fs.h"
#include "workers/text/jsonl_record.h"

namespace rp::scheduler::runtime {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxTokenizerBytes = 64ull << 20;  // real ones are 2-35 MB
// Parsing a tokenizer.json costs about ten times its size while it runs (the JSON value, then
// the vocabulary's maps): at most this many are parsed or held at once, whoever asks (Submit's
// admission threads, 64 of them, and the runner), so concurrent submits cannot multiply that peak.
constexpr std::ptrdiff_t kConcurrentTokenizerLoads = 2;

std::counting_semaphore<kConcurrentTokenizerLoads>& TokenizerLoadGate() {
  static std::counting_semaphore<kConcurrentTokenizerLoads> gate(kConcurrentTokenizerLoads);
  return gate;
}
constexpr uint64_t kMaxConfigBytes = 16ull << 20;

std::atomic<int64_t>& ParseReservation() {
  static std::atomic<int64_t> bytes{0};
  return bytes;
}
// A parse's share of ParseReservation while it runs (its transient peak is not resident yet;
// what it leaves behind is, and MemAvailable sees that).
class ParseReserved {
 public:
  explicit ParseReserved(int64_t bytes) : bytes_(bytes) { ParseReservation() += bytes_; }
  ~ParseReserved() { ParseReservation() -= bytes_; }
  ParseReserved(const ParseReserved&) = delete;
  ParseReserved& operator=(const ParseReserved&) = delete;

 private:
  const int64_t bytes_;
};

// A read-only mapping that unmaps itself.
struct Mapping {
  const char* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data != nullptr) munmap(const_cast<char*>(data), size);
  }
};

// One record's tokens appended to `out`; errors name the file and the line (the message is built
// only on error: this runs once per record).
absl::Status AppendRecord(std::string_view line, const std::string& path, int64_t line_no, const LoadedTokenizer& tok,
                          const JsonlLimits& limits, PackedTokens* out) {
  auto where = [&] { return absl::StrCat("dataset '", path, "' line ", line_no); };
  const double budget_s =
      std::max(limits.min_record_seconds, static_cast<double>(line.size()) / limits.min_bytes_per_second);
  workers::text::WorkLimits work{
      limits.stop, std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          std::chrono::duration<double>(budget_s))};
  // The ids of one field, or why not: a stop is Cancelled (no line: nothing is wrong with it).
  auto encode = [&](const std::string& text, bool special) -> absl::StatusOr<std::vector<int32_t>> {
    auto ids = tok.tokenizer.Encode(text, special, work);
    if (ids.ok() || ids.status().code() == absl::StatusCode::kCancelled) return ids;
    if (ids.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tokenizing took more than its budget of %.1f s for %d bytes (a pre-tokenizer pattern that "
          "backtracks?)",
          where(), budget_s, line.size()));
    }
    return absl::InvalidArgumentError(absl::StrCat(where(), ": ", ids.status().message()));
  };
  auto append = [&](const std::vector<int32_t>& ids, bool trained) {
    out->tokens.insert(out->tokens.end(), ids.begin(), ids.end());
    out->trained.insert(out->trained.end(), ids.size(), trained ? 1 : 0);
  };
  const size_t first_token = out->tokens.size();
  auto rec = workers::text::ParseJsonlRecord(line);
  if (!rec.ok()) return absl::InvalidArgumentError(absl::StrCat(where(), ": ", rec.status().message()));
  if (rec->has_prompt) {
    auto p = encode(rec->prompt, /*special=*/true);
    if (!p.ok()) return p.status();
    auto c = encode(rec->text, /*special=*/false);
    if (!c.ok()) return c.status();
    append(*p, false);
    append(*c, true);
  } else {
    auto ids = encode(rec->text, /*special=*/true);
    if (!ids.ok()) return ids.status();
    append(*ids, true);
  }
  if (tok.eos_id) append({*tok.eos_id}, true);
  if (out->tokens.size() > first_token) out->document_starts.push_back(static_cast<int64_t>(first_token));
  ++out->documents;
  return absl::OkStatus();
}

}  // namespace

int64_t TokenizerParseBytesInFlight() { return ParseReservation().load(); }

absl::StatusOr<LoadedTokenizer> LoadTokenizerDir(const std::string& dir, const std::string& eos_token) {
  const std::string file = dir + "/tokenizer.json";
  TokenizerLoadGate().acquire();
  // Released when the loaded tokenizer (or this attempt) is gone; the parse's freed memory is
  // handed back first (glibc keeps it in the loading thread's arena otherwise).
  std::shared_ptr<void> permit(nullptr, [](void*) {
    malloc_trim(0);
    TokenizerLoadGate().release();
  });
  auto text = files::ReadSmallFile(file, kMaxTokenizerBytes);
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat("tokenizer: ", text.status().message()));
  absl::StatusOr<workers::text::Tokenizer> tok;
  {
    ParseReserved reserved(static_cast<int64_t>(text->size()) * kTokenizerParsePeakFactor);
    tok = workers::text::Tokenizer::FromJson(*text);
  }
  if (!tok.ok()) return absl::InvalidArgumentError(absl::StrCat("tokenizer '", file, "': ", tok.status().message()));
  std::string eos = eos_token;
  if (eos.empty()) {
    const std::string cfg_file = dir + "/tokenizer_config.json";
    if (files::KindOf(cfg_file) == files::FileKind::kFile) {
      auto cfg_text = files::ReadSmallFile(cfg_file, kMaxConfigBytes);
      if (!cfg_text.ok()) return cfg_text.status();
      auto cfg = files::ParseBoundedJson(*cfg_text, absl::StrCat("'", cfg_file, "'"));
      if (!cfg.ok()) return cfg.status();
      if (!cfg->is_object()) return absl::InvalidArgumentError(absl::StrCat("'", cfg_file, "' is not a JSON object"));
      const json& e = files::MemberOrNull(*cfg, "eos_token");
      if (e.is_string()) {
        eos = e.get<std::string>();
      } else if (e.is_object() && e.contains("content") && e["content"].is_string()) {
        eos = e["content"].get<std::string>();
      }
    }
  }
  std::optional<int32_t> eos_id;
  if (!eos.empty()) {
    eos_id = tok->TokenToId(eos);
    if (!eos_id) {
      return absl::InvalidArgumentError(
          absl::StrCat("eos_token '", eos, "' is not a token of '", file, "' (set data.token_file.eos_token)"));
    }
  }
  return LoadedTokenizer{std::move(permit), *std::move(tok), eos_id};
}

absl::StatusOr<PackedTokens> ReadJsonlDocuments(const std::string& path, const LoadedTokenizer& tok,
                                                const JsonlLimits& limits) {
  uint64_t bytes = 0;
  auto fd = files::OpenForRead(path, &bytes);
  if (!fd.ok()) return absl::Status(fd.status().code(), absl::StrCat("dataset: ", fd.status().message()));
  Mapping map;
  if (bytes > 0) {
    void* m = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd->get(), 0);
    if (m == MAP_FAILED) return absl::InternalError(absl::StrCat("dataset '", path, "': mmap: ", std::strerror(errno)));
    map.data = static_cast<const char*>(m);
    map.size = bytes;
  }
  const std::string_view all(map.data == nullptr ? "" : map.data, map.size);
  // The records (non-blank lines) and their line numbers, then tokenized in contiguous chunks on
  // a few threads; the chunks are joined in file order, so the stream is the sequential one, and
  // the error reported is the one of the first bad line, as a sequential pass would report it.
  struct Line {
    std::string_view text;
    int64_t number;
  };
  std::vector<Line> lines;
  int64_t line_no = 0;
  for (size_t pos = 0; pos < all.size();) {
    size_t end = all.find('\n', pos);
    if (end == std::string_view::npos) end = all.size();
    std::string_view line = all.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) lines.push_back({line, line_no});
  }
  if (lines.empty()) return absl::InvalidArgumentError(absl::StrCat("dataset '", path, "' holds no records"));
  const size_t threads =
      std::clamp<size_t>(lines.size() / 256, 1, std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8));
  struct Chunk {
    PackedTokens packed;
    absl::Status status;
  };
  std::vector<Chunk> chunks(threads);
  std::atomic<int64_t> done{0};
  std::atomic<size_t> finished{0};
  // The calling thread tokenizes the first chunk (its allocations stay in its own arena, as a
  // sequential read's would) and reports how far all of them are, while it works and after.
  auto last = std::chrono::steady_clock::now();
  auto report = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (!limits.progress || now - last < limits.progress_every) return;
    last = now;
    limits.progress(done.load(), static_cast<int64_t>(lines.size()));
  };
  auto work = [&](size_t c) {
    const size_t begin = lines.size() * c / threads, end = lines.size() * (c + 1) / threads;
    for (size_t k = begin; k < end; ++k) {
      chunks[c].status = AppendRecord(lines[k].text, path, lines[k].number, tok, limits, &chunks[c].packed);
      ++done;
      if (c == 0) report();
      if (!chunks[c].status.ok()) break;
    }
    ++finished;
  };
  std::vector<std::thread> pool;
  for (size_t c = 1; c < threads; ++c) pool.emplace_back(work, c);
  work(0);
  while (finished.load() < threads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    report();
  }
  for (auto& t : pool) t.join();
  PackedTokens out;
  if (limits.stop != nullptr && limits.stop->load()) {
    return absl::CancelledError(absl::StrCat("reading '", path, "' was stopped"));
  }
  for (Chunk& c : chunks) {
    if (!c.status.ok()) return c.status;  // chunks are in file order: the first bad line wins
    const auto base = static_cast<int64_t>(out.tokens.size());
    for (int64_t d : c.packed.document_starts) out.document_starts.push_back(base + d);
    out.tokens.insert(out.tokens.end(), c.packed.tokens.begin(), c.packed.tokens.end());
    out.trained.insert(out.trained.end(), c.packed.trained.begin(), c.packed.trained.end());
    out.documents += c.packed.documents;
  }
  return out;
}

}  // namespace rp::scheduler::runtime
