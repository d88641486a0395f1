// pre_tokenizer.h — the pre-tokenizers of byte-level BPE tokenizers, as Hugging Face `tokenizers`
// defines them: `Split` (a regex and a delimiter behaviour) and `ByteLevel` (optional prefix
// space, optional GPT-2 split regex, then the byte-level alphabet), chained by `Sequence`.
// Regexes are PCRE2 with Unicode properties (UTF + UCP), JIT-compiled where the CPU allows. With
// UCP, PCRE2's \s, \p{L}, \p{N} classes agree with Oniguruma's (what `tokenizers` uses) on the
// test corpus, U+0085 and U+2028 included (tests/unit/workers/text).
//
// Contract: built once (Create* returns InvalidArgument naming a pattern that does not compile),
// then immutable: Apply is const and safe from any number of threads.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/text/work_limits.h"

namespace rp::workers::text {

class Regex;

// How a Split step treats the regex's matches ("behavior" in tokenizer.json).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // One step of the chain.
  struct Step {
    enum class Kind { kSplit, kByteLevel } kind;
    std::shared_ptr<const Regex> regex;  // kSplit, or kByteLevel with use_regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;            // kSplit: the matches are the pieces, the rest the delimiters
    bool add_prefix_space = false;  // kByteLevel
  };

  static absl::StatusOr<Step> SplitStep(std::string_view pattern, SplitBehavior behavior, bool invert);
  static absl::StatusOr<Step> ByteLevelStep(bool add_prefix_space, bool use_regex);

  explicit PreTokenizer(std::vector<Step> steps) : steps_(std::move(steps)) {}

  // The pieces of `text` (each a BPE word; byte-level spelled when the chain has a ByteLevel step).
  // Without limits a pattern that runs past PCRE2's match limit leaves the rest of its piece
  // unsplit; with them that is ResourceExhausted, and `limits` are checked between matches.
  std::vector<std::string> Apply(std::string_view text) const;
  absl::StatusOr<std::vector<std::string>> Apply(std::string_view text, const WorkLimits& limits) const;
  // The same pieces, each handed to `word` as it is decided (valid during the call): no piece is
  // held beyond the one in hand, so a large text costs no vector of its pieces. `limits` may be
  // null (then it cannot fail).
  absl::Status ForEachWord(std::string_view text, const WorkLimits* limits,
                           const std::function<void(std::string_view)>& word) const;
  bool byte_level() const;

 private:
  absl::StatusOr<std::vector<std::string>> ApplyWithin(std::string_view text, const WorkLimits* limits) const;
  absl::Status Walk(size_t step, std::string_view piece, const WorkLimits* limits,
                    const std::function<void(std::string_view)>& word) const;
  std::vector<Step> steps_;
};

// A compiled PCRE2 pattern; FindAll returns the [begin, end) byte ranges of successive matches.
class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // With `limits` (may be null): checked between matches; a PCRE2 resource limit is then
  // ResourceExhausted naming the byte, where without them the rest counts as unmatched.
  absl::Status FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out,
                       const WorkLimits* limits = nullptr) const;
  // The same matches handed to `match(begin, end)` one by one.
  absl::Status ForEachMatch(std::string_view text, const std::function<void(size_t, size_t)>& match,
                            const WorkLimits* limits = nullptr) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8
};

}  // namespace rp::workers::text
