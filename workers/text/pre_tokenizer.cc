#include "workers/text/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "workers/text/byte_level.h"

namespace rp::workers::text {
namespace {

// GPT-2's split, what ByteLevel(use_regex=true) applies.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

absl::StatusOr<std::shared_ptr<const Regex>> Regex::Compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return absl::InvalidArgumentError(absl::StrCat("pre_tokenizer regex '", std::string(pattern),
                                                   "' does not compile at offset ", offset, ": ",
                                                   reinterpret_cast<const char*>(msg)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: without JIT it still matches
  std::shared_ptr<Regex> r(new Regex());
  r->code_ = code;
  return std::shared_ptr<const Regex>(std::move(r));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out,
                            const WorkLimits* limits) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  absl::Status status;
  for (uint32_t calls = 0; start <= text.size(); ++calls) {
    if (limits != nullptr && calls % 16 == 0) {
      status = limits->Check();
      if (!status.ok()) break;
    }
    const int rc = pcre2_match(code, subject, text.size(), start, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {  // a resource limit (match, depth, heap): refused with limits, else the rest is unmatched
      if (limits != nullptr) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        status = absl::ResourceExhaustedError(absl::StrCat("the pre-tokenizer regex stopped at byte ", start, " of ",
                                                           text.size(), ": ", reinterpret_cast<const char*>(msg)));
      }
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out->emplace_back(b, e);
      start = e;
    } else {  // an empty match: step over one character
      size_t next = b;
      if (next >= text.size()) break;
      NextCodepoint(text, &next);
      start = next;
    }
  }
  pcre2_match_data_free(md);
  return status;
}

absl::StatusOr<PreTokenizer::Step> PreTokenizer::SplitStep(std::string_view pattern, SplitBehavior behavior,
                                                           bool invert) {
  auto regex = Regex::Compile(pattern);
  if (!regex.ok()) return regex.status();
  Step s{Step::Kind::kSplit, *std::move(regex)};
  s.behavior = behavior;
  s.invert = invert;
  return s;
}

absl::StatusOr<PreTokenizer::Step> PreTokenizer::ByteLevelStep(bool add_prefix_space, bool use_regex) {
  Step s{Step::Kind::kByteLevel, nullptr};
  s.add_prefix_space = add_prefix_space;
  if (use_regex) {
    auto regex = Regex::Compile(kGpt2Pattern);
    if (!regex.ok()) return regex.status();
    s.regex = *std::move(regex);
  }
  return s;
}

bool PreTokenizer::byte_level() const {
  for (const Step& s : steps_) {
    if (s.kind == Step::Kind::kByteLevel) return true;
  }
  return false;
}

namespace {

// Splits `piece` by `regex` the way `tokenizers`' Split does and appends the non-empty results.
absl::Status SplitPiece(const std::string& piece, const Regex& regex, SplitBehavior behavior, bool invert,
                        std::vector<std::pair<size_t, size_t>>* scratch, std::vector<std::string>* out,
                        const WorkLimits* limits) {
  scratch->clear();
  if (absl::Status st = regex.FindAll(piece, scratch, limits); !st.ok()) return st;
  // Segments in order: (begin, end, is_delimiter).
  struct Seg {
    size_t b, e;
    bool delim;
  };
  std::vector<Seg> segs;
  size_t pos = 0;
  for (auto [b, e] : *scratch) {
    if (b > pos) segs.push_back({pos, b, invert});
    segs.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < piece.size()) segs.push_back({pos, piece.size(), invert});
  // The folds of `tokenizers`' NormalizedString::split, over (range, is_delimiter) segments.
  std::vector<std::pair<size_t, size_t>> kept;
  bool previous = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Seg& s : segs) {
        if (!s.delim) kept.emplace_back(s.b, s.e);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Seg& s : segs) kept.emplace_back(s.b, s.e);
      break;
    case SplitBehavior::kContiguous:
      for (const Seg& s : segs) {
        if (s.delim == previous && !kept.empty()) {
          kept.back().second = s.e;
        } else {
          kept.emplace_back(s.b, s.e);
        }
        previous = s.delim;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Seg& s : segs) {
        if (s.delim && !previous && !kept.empty()) {
          kept.back().second = s.e;
        } else {
          kept.emplace_back(s.b, s.e);
        }
        previous = s.delim;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->delim && !previous && !kept.empty()) {
          kept.back().first = it->b;
        } else {
          kept.emplace_back(it->b, it->e);
        }
        previous = it->delim;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (auto [b, e] : kept) {
    if (e > b) out->emplace_back(piece.substr(b, e - b));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> PreTokenizer::Apply(std::string_view text) const {
  return *ApplyWithin(text, nullptr);  // never fails without limits
}

absl::StatusOr<std::vector<std::string>> PreTokenizer::Apply(std::string_view text, const WorkLimits& limits) const {
  return ApplyWithin(text, &limits);
}

absl::StatusOr<std::vector<std::string>> PreTokenizer::ApplyWithin(std::string_view text,
                                                                   const WorkLimits* limits) const {
  std::vector<std::string> pieces{std::string(text)};
  std::vector<std::string> next;
  std::vector<std::pair<size_t, size_t>> scratch;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string& p : pieces) {
      if (step.kind == Step::Kind::kSplit) {
        if (absl::Status st = SplitPiece(p, *step.regex, step.behavior, step.invert, &scratch, &next, limits);
            !st.ok()) {
          return st;
        }
        continue;
      }
      if (step.add_prefix_space && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
      std::vector<std::string> words;
      if (step.regex) {
        if (absl::Status st = SplitPiece(p, *step.regex, SplitBehavior::kIsolated, false, &scratch, &words, limits);
            !st.ok()) {
          return st;
        }
      } else {
        words.push_back(std::move(p));
      }
      for (const std::string& w : words) {
        std::string mapped;
        ByteLevelEncode(w, &mapped);
        next.push_back(std::move(mapped));
      }
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace rp::workers::text
