#include "workers/text/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <functional>
#include <optional>

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
  return ForEachMatch(
      text, [out](size_t b, size_t e) { out->emplace_back(b, e); }, limits);
}

absl::Status Regex::ForEachMatch(std::string_view text, const std::function<void(size_t, size_t)>& match,
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
      match(b, e);
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

// `tokenizers`' NormalizedString::split folds over (range, is_delimiter) segments, one segment at a
// time: the kept ranges go to `emit` in order as they are decided, so nothing of the text's
// pieces is held beyond one pending range (a 64 MiB record is not split into a vector first).
class SplitFold {
 public:
  SplitFold(SplitBehavior behavior, const std::function<absl::Status(size_t, size_t)>& emit)
      : behavior_(behavior), emit_(emit) {}

  absl::Status Segment(size_t b, size_t e, bool delim) {
    switch (behavior_) {
      case SplitBehavior::kRemoved:
        return delim ? absl::OkStatus() : Emit(b, e);
      case SplitBehavior::kIsolated:
        return Emit(b, e);
      case SplitBehavior::kContiguous:            // runs of the same kind become one piece
      case SplitBehavior::kMergedWithPrevious: {  // a delimiter joins the piece before it
        const bool join = behavior_ == SplitBehavior::kContiguous ? delim == previous_ : delim && !previous_;
        previous_ = delim;
        if (join && pending_) {
          pending_->second = e;
          return absl::OkStatus();
        }
        absl::Status st = Flush();
        pending_.emplace(b, e);
        return st;
      }
      case SplitBehavior::kMergedWithNext:  // a delimiter joins the piece after it unless that is one too
        if (delim) {
          absl::Status st = Flush();
          pending_.emplace(b, e);
          return st;
        }
        if (pending_) {
          const size_t from = pending_->first;
          pending_.reset();
          return Emit(from, e);
        }
        return Emit(b, e);
    }
    return absl::OkStatus();
  }
  absl::Status Flush() {
    if (!pending_) return absl::OkStatus();
    const auto [b, e] = *pending_;
    pending_.reset();
    return Emit(b, e);
  }

 private:
  absl::Status Emit(size_t b, size_t e) { return e > b ? emit_(b, e) : absl::OkStatus(); }
  const SplitBehavior behavior_;
  const std::function<absl::Status(size_t, size_t)>& emit_;
  bool previous_ = false;
  std::optional<std::pair<size_t, size_t>> pending_;
};

// Splits `piece` by `regex` the way `tokenizers`' Split does; each kept piece goes to `next`.
absl::Status SplitStream(std::string_view piece, const Regex& regex, SplitBehavior behavior, bool invert,
                         const WorkLimits* limits, const std::function<absl::Status(std::string_view)>& next) {
  const std::function<absl::Status(size_t, size_t)> emit = [&](size_t b, size_t e) {
    return next(piece.substr(b, e - b));
  };
  SplitFold fold(behavior, emit);
  absl::Status st;  // the first failure of a later step; the rest of the matches are skipped
  size_t pos = 0;
  absl::Status found = regex.ForEachMatch(
      piece,
      [&](size_t b, size_t e) {
        if (!st.ok()) return;
        if (b > pos) st = fold.Segment(pos, b, invert);
        if (st.ok()) st = fold.Segment(b, e, !invert);
        pos = e;
      },
      limits);
  if (!st.ok()) return st;
  if (!found.ok()) return found;
  if (pos < piece.size()) st = fold.Segment(pos, piece.size(), invert);
  if (!st.ok()) return st;
  return fold.Flush();
}

}  // namespace

absl::Status PreTokenizer::Walk(size_t step, std::string_view piece, const WorkLimits* limits,
                                const std::function<void(std::string_view)>& word) const {
  if (step == steps_.size()) {
    word(piece);
    return absl::OkStatus();
  }
  const Step& s = steps_[step];
  auto deeper = [&](std::string_view p) { return Walk(step + 1, p, limits, word); };
  if (s.kind == Step::Kind::kSplit) return SplitStream(piece, *s.regex, s.behavior, s.invert, limits, deeper);
  std::string prefixed;
  if (s.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
    prefixed.reserve(piece.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(piece);
    piece = prefixed;
  }
  std::string mapped;
  auto byte_level = [&](std::string_view w) {
    mapped.clear();
    ByteLevelEncode(w, &mapped);
    return deeper(mapped);
  };
  if (s.regex) return SplitStream(piece, *s.regex, SplitBehavior::kIsolated, false, limits, byte_level);
  return byte_level(piece);
}

absl::Status PreTokenizer::ForEachWord(std::string_view text, const WorkLimits* limits,
                                       const std::function<void(std::string_view)>& word) const {
  return Walk(0, text, limits, word);
}

std::vector<std::string> PreTokenizer::Apply(std::string_view text) const {
  return *ApplyWithin(text, nullptr);  // never fails without limits
}

absl::StatusOr<std::vector<std::string>> PreTokenizer::Apply(std::string_view text, const WorkLimits& limits) const {
  return ApplyWithin(text, &limits);
}

absl::StatusOr<std::vector<std::string>> PreTokenizer::ApplyWithin(std::string_view text,
                                                                   const WorkLimits* limits) const {
  std::vector<std::string> pieces;
  absl::Status st = Walk(0, text, limits, [&](std::string_view w) { pieces.emplace_back(w); });
  if (!st.ok()) return st;
  return pieces;
}

}  // namespace rp::workers::text
