#include "workers/text/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "workers/base/json_depth.h"
#include "workers/files/bounded_json.h"
#include "workers/text/bpe_model.h"
#include "workers/text/byte_level.h"
#include "workers/text/pre_tokenizer.h"

namespace rp::workers::text {
namespace {

using json = nlohmann::json;
using files::MemberOrNull;

absl::Status Unsupported(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", where, ": ", what, " is not supported"));
}
absl::Status Bad(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", where, ": ", what));
}

std::string TypeOf(const json& j) {
  const json& t = MemberOrNull(j, "type");
  return t.is_string() ? t.get<std::string>() : "";
}

bool Flag(const json& j, const char* key, bool def = false) {
  const json& f = MemberOrNull(j, key);
  return f.is_boolean() ? f.get<bool>() : def;
}

// An id of the file: an integer in [0, 2^24) (every real vocabulary is far smaller), checked in
// 64 bits so that no value wraps into range.
bool ValidId(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() < (uint64_t{1} << 24);
  return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t{1} << 24);
}

// A literal for PCRE2: every non-alphanumeric ASCII character escaped.
std::string QuoteRegex(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  struct Added {
    std::string content;
    int32_t id;
    bool special;
  };
  // Added tokens matched on the raw text (normalized=false) and after normalization
  // (normalized=true), each indexed by first byte, longest first (leftmost-longest matching).
  struct AddedSet {
    std::vector<Added> tokens;
    std::array<std::vector<int32_t>, 256> by_first;
    void Index() {
      for (auto& v : by_first) v.clear();
      for (size_t i = 0; i < tokens.size(); ++i) {
        by_first[static_cast<unsigned char>(tokens[i].content[0])].push_back(static_cast<int32_t>(i));
      }
      for (auto& v : by_first) {
        std::stable_sort(v.begin(), v.end(),
                         [&](int32_t a, int32_t b) { return tokens[a].content.size() > tokens[b].content.size(); });
      }
    }
    // Calls text(piece) for text between matches and token(id) for each match, in order.
    template <typename TextFn, typename TokenFn>
    void Split(std::string_view s, TextFn&& text, TokenFn&& token) const {
      size_t last = 0;
      for (size_t i = 0; i < s.size();) {
        const Added* hit = nullptr;
        for (int32_t k : by_first[static_cast<unsigned char>(s[i])]) {
          const std::string& c = tokens[k].content;
          if (s.compare(i, c.size(), c) == 0) {
            hit = &tokens[k];
            break;
          }
        }
        if (hit == nullptr) {
          ++i;
          continue;
        }
        if (i > last) text(s.substr(last, i - last));
        token(hit->id);
        i += hit->content.size();
        last = i;
      }
      if (last < s.size()) text(s.substr(last));
    }
  };

  AddedSet raw_added, normalized_added;
  std::unordered_map<int32_t, Added> added_by_id;
  bool nfc = false;
  std::optional<PreTokenizer> pre;
  std::optional<BpeModel> model;
  // add_special_tokens: the ids before and after the sequence (TemplateProcessing "single").
  std::vector<int32_t> template_before, template_after;
  enum class Decoder { kJoinWithSpaces, kByteLevel } decoder = Decoder::kJoinWithSpaces;
  int32_t id_limit = 0;

  absl::Status ParseAddedTokens(const json& j);
  absl::Status ParseNormalizer(const json& j, absl::string_view where);
  absl::Status ParsePreTokenizer(const json& j, absl::string_view where, std::vector<PreTokenizer::Step>* steps);
  absl::Status ParseModel(const json& j);
  absl::Status ParsePostProcessor(const json& j, absl::string_view where);
  absl::Status ParseDecoder(const json& j, absl::string_view where);

  // `limits` may be null (no bounds; never fails).
  absl::Status EncodeText(std::string_view text, std::vector<int32_t>* out, const WorkLimits* limits) const;
};

absl::Status Tokenizer::Impl::ParseAddedTokens(const json& j) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_array()) return Bad("added_tokens", "must be an array");
  for (size_t i = 0; i < j.size(); ++i) {
    const json& t = j[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!MemberOrNull(t, "id").is_number_integer() || !MemberOrNull(t, "content").is_string()) {
      return Bad(where, "needs an integer 'id' and a string 'content'");
    }
    if (!ValidId(t["id"])) return Bad(where, absl::StrCat("id ", t["id"].dump(), " is out of range [0, 2^24)"));
    Added a{t["content"].get<std::string>(), t["id"].get<int32_t>(), Flag(t, "special")};
    if (a.content.empty()) return Bad(where, "has empty content");
    for (const char* f : {"lstrip", "rstrip", "single_word"}) {
      if (Flag(t, f)) return Unsupported(where, absl::StrCat("'", a.content, "' with ", f, "=true"));
    }
    const bool normalized = Flag(t, "normalized", !a.special);
    (normalized ? normalized_added : raw_added).tokens.push_back(a);
    added_by_id[a.id] = a;
    id_limit = std::max(id_limit, a.id + 1);
  }
  raw_added.Index();
  normalized_added.Index();
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseNormalizer(const json& j, absl::string_view where) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  if (type == "NFC") {
    nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence" && MemberOrNull(j, "normalizers").is_array()) {
    for (size_t i = 0; i < j["normalizers"].size(); ++i) {
      if (auto s = ParseNormalizer(j["normalizers"][i], absl::StrCat(where, ".normalizers[", i, "]")); !s.ok())
        return s;
    }
    return absl::OkStatus();
  }
  return Unsupported(where, absl::StrCat("type '", type, "' (supported: NFC, Sequence)"));
}

absl::Status Tokenizer::Impl::ParsePreTokenizer(const json& j, absl::string_view where,
                                                std::vector<PreTokenizer::Step>* steps) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence" && MemberOrNull(j, "pretokenizers").is_array()) {
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i) {
      if (auto s = ParsePreTokenizer(j["pretokenizers"][i], absl::StrCat(where, ".pretokenizers[", i, "]"), steps);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    auto step = PreTokenizer::ByteLevelStep(Flag(j, "add_prefix_space"), Flag(j, "use_regex", true));
    if (!step.ok()) return step.status();
    steps->push_back(*std::move(step));
    return absl::OkStatus();
  }
  if (type == "Split") {
    static const std::unordered_map<std::string, SplitBehavior> kBehaviors = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    const json& bj = MemberOrNull(j, "behavior");
    const std::string behavior = bj.is_string() ? bj.get<std::string>() : "";
    auto b = kBehaviors.find(behavior);
    if (b == kBehaviors.end()) return Unsupported(where, absl::StrCat("Split behavior '", behavior, "'"));
    std::string pattern;
    const json& p = MemberOrNull(j, "pattern");
    if (MemberOrNull(p, "Regex").is_string()) {
      pattern = p["Regex"].get<std::string>();
    } else if (MemberOrNull(p, "String").is_string()) {
      pattern = QuoteRegex(p["String"].get<std::string>());
    } else {
      return Bad(where, "Split needs pattern {\"Regex\": ...} or {\"String\": ...}");
    }
    auto step = PreTokenizer::SplitStep(pattern, b->second, Flag(j, "invert"));
    if (!step.ok()) return Bad(where, step.status().message());
    steps->push_back(*std::move(step));
    return absl::OkStatus();
  }
  return Unsupported(where, absl::StrCat("type '", type, "' (supported: Split, ByteLevel, Sequence)"));
}

absl::Status Tokenizer::Impl::ParseModel(const json& j) {
  if (!j.is_object()) return Bad("model", "must be an object");
  const std::string type = TypeOf(j);
  if (!type.empty() && type != "BPE") return Unsupported("model", absl::StrCat("type '", type, "' (supported: BPE)"));
  if (!MemberOrNull(j, "vocab").is_object()) return Bad("model", "needs a 'vocab' object");
  if (!MemberOrNull(j, "merges").is_array()) return Bad("model", "needs a 'merges' array");
  const json& dropout = MemberOrNull(j, "dropout");
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0)) {
    return Unsupported("model", "BPE dropout");
  }
  for (const char* f : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = MemberOrNull(j, f);
    if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty())) return Unsupported("model", f);
  }
  if (Flag(j, "byte_fallback")) return Unsupported("model", "byte_fallback (a SentencePiece-style BPE)");
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(j["vocab"].size());
  for (const auto& [tok, id] : j["vocab"].items()) {
    if (!id.is_number_integer()) return Bad("model.vocab", absl::StrCat("'", tok, "' has no integer id"));
    if (!ValidId(id)) return Bad("model.vocab", absl::StrCat("'", tok, "' has id ", id.dump(), " (not in [0, 2^24))"));
    vocab.emplace(tok, id.get<int32_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(j["merges"].size());
  for (size_t i = 0; i < j["merges"].size(); ++i) {
    const json& m = j["merges"][i];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Bad(absl::StrCat("model.merges[", i, "]"), absl::StrCat("'", s, "' is not two tokens"));
      }
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return Bad(absl::StrCat("model.merges[", i, "]"), "must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  BpeModel::Options opts;
  opts.ignore_merges = Flag(j, "ignore_merges");
  opts.fuse_unk = Flag(j, "fuse_unk");
  if (MemberOrNull(j, "unk_token").is_string()) opts.unk_token = j["unk_token"].get<std::string>();
  auto m = BpeModel::Create(std::move(vocab), merges, std::move(opts));
  if (!m.ok()) return Bad("model", m.status().message());
  model.emplace(*std::move(m));
  id_limit = std::max(id_limit, model->IdLimit());
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParsePostProcessor(const json& j, absl::string_view where) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence" && MemberOrNull(j, "processors").is_array()) {
    for (size_t i = 0; i < j["processors"].size(); ++i) {
      if (auto s = ParsePostProcessor(j["processors"][i], absl::StrCat(where, ".processors[", i, "]")); !s.ok())
        return s;
    }
    return absl::OkStatus();
  }
  if (type == "TemplateProcessing") {
    const json& single = MemberOrNull(j, "single");
    if (!single.is_array()) return Bad(where, "TemplateProcessing needs a 'single' array");
    const json& specials = MemberOrNull(j, "special_tokens");
    bool after = false;
    for (size_t k = 0; k < single.size(); ++k) {
      const json& piece = single[k];
      const std::string at = absl::StrCat(where, ".single[", k, "]");
      if (!MemberOrNull(piece, "Sequence").is_null()) {
        after = true;
        continue;
      }
      const json& name_j = MemberOrNull(MemberOrNull(piece, "SpecialToken"), "id");
      if (!name_j.is_string())
        return Bad(at, "must be {\"SpecialToken\": {\"id\": \"<name>\"}} or {\"Sequence\": ...}");
      const std::string name = name_j.get<std::string>();
      const json& ids = MemberOrNull(MemberOrNull(specials, name), "ids");
      if (!ids.is_array())
        return Bad(where, absl::StrCat("special token '", name, "' has no 'ids' array in special_tokens"));
      for (const json& id : ids) {
        if (!ValidId(id)) {
          return Bad(where, absl::StrCat("special_tokens['", name, "'].ids holds ", id.dump(),
                                         " (ids are integers in [0, 2^24))"));
        }
        const int32_t v = id.get<int32_t>();
        (after ? template_after : template_before).push_back(v);
        id_limit = std::max(id_limit, v + 1);  // the model's vocabulary check covers template ids too
      }
    }
    return absl::OkStatus();
  }
  return Unsupported(where, absl::StrCat("type '", type, "' (supported: TemplateProcessing, ByteLevel, Sequence)"));
}

absl::Status Tokenizer::Impl::ParseDecoder(const json& j, absl::string_view where) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  if (type == "ByteLevel") {
    decoder = Decoder::kByteLevel;
    return absl::OkStatus();
  }
  if (type == "Sequence" && MemberOrNull(j, "decoders").is_array()) {
    for (size_t i = 0; i < j["decoders"].size(); ++i) {
      if (auto s = ParseDecoder(j["decoders"][i], absl::StrCat(where, ".decoders[", i, "]")); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return Unsupported(where, absl::StrCat("type '", type, "' (supported: ByteLevel, Sequence)"));
}

absl::Status Tokenizer::Impl::EncodeText(std::string_view text, std::vector<int32_t>* out,
                                         const WorkLimits* limits) const {
  absl::Status status;  // the first limit hit; the rest of the text is then skipped
  auto model_words = [&](std::string_view piece) {
    if (!status.ok()) return;
    if (!pre) {
      model->Tokenize(piece, out);
      return;
    }
    // Word by word as the pre-tokenizer decides them: no vector of the text's pieces.
    status = pre->ForEachWord(piece, limits, [&](std::string_view w) { model->Tokenize(w, out); });
  };
  auto push = [&](int32_t id) { out->push_back(id); };
  raw_added.Split(
      text,
      [&](std::string_view piece) {
        std::string normalized;
        if (nfc) {
          utf8proc_uint8_t* dst = nullptr;
          const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(piece.data()),
                                      static_cast<utf8proc_ssize_t>(piece.size()), &dst,
                                      static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
          if (n >= 0) {
            normalized.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
            piece = normalized;
          }  // malformed UTF-8 is encoded as it is
          std::free(dst);
        }
        normalized_added.Split(piece, model_words, push);
      },
      push);
  return status;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

absl::StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view text) {
  // Depth first (every walk below recurses over the nesting), then the iterative parse.
  if (std::string deep = base::JsonDepthError(text); !deep.empty()) return Bad("file", deep);
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad("file", "is not a JSON object");
  auto impl = std::make_unique<Impl>();
  if (auto s = impl->ParseAddedTokens(MemberOrNull(j, "added_tokens")); !s.ok()) return s;
  if (auto s = impl->ParseNormalizer(MemberOrNull(j, "normalizer"), "normalizer"); !s.ok()) return s;
  std::vector<PreTokenizer::Step> steps;
  if (auto s = impl->ParsePreTokenizer(MemberOrNull(j, "pre_tokenizer"), "pre_tokenizer", &steps); !s.ok()) return s;
  if (!steps.empty()) impl->pre.emplace(std::move(steps));
  if (!j.contains("model")) return Bad("file", "has no 'model'");
  if (auto s = impl->ParseModel(j["model"]); !s.ok()) return s;
  if (auto s = impl->ParsePostProcessor(MemberOrNull(j, "post_processor"), "post_processor"); !s.ok()) return s;
  if (auto s = impl->ParseDecoder(MemberOrNull(j, "decoder"), "decoder"); !s.ok()) return s;
  for (const char* f : {"truncation", "padding"}) {
    if (!MemberOrNull(j, f).is_null()) return Unsupported(f, "a non-null value (the job sets sequence lengths)");
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out = impl_->template_before;
  (void)impl_->EncodeText(text, &out, nullptr);  // cannot fail without limits
  if (add_special_tokens) out.insert(out.end(), impl_->template_after.begin(), impl_->template_after.end());
  return out;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special_tokens,
                                                       const WorkLimits& limits) const {
  if (absl::Status st = limits.Check(); !st.ok()) return st;
  std::vector<int32_t> out;
  if (add_special_tokens) out = impl_->template_before;
  if (absl::Status st = impl_->EncodeText(text, &out, &limits); !st.ok()) return st;
  if (add_special_tokens) out.insert(out.end(), impl_->template_after.begin(), impl_->template_after.end());
  return out;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string_view> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
      if (!(skip_special_tokens && it->second.special)) tokens.push_back(it->second.content);
      continue;
    }
    const std::string_view t = impl_->model->IdToToken(id);
    if (!t.empty()) tokens.push_back(t);
  }
  if (impl_->decoder == Impl::Decoder::kJoinWithSpaces) {  // `tokenizers` without a decoder
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) (joined += i ? " " : "") += tokens[i];
    return joined;
  }
  std::string bytes;
  for (std::string_view t : tokens) ByteLevelDecodeToken(t, &bytes);
  return Utf8Lossy(bytes);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  for (const Impl::AddedSet* set : {&impl_->raw_added, &impl_->normalized_added}) {
    for (const auto& a : set->tokens) {
      if (a.content == token) return a.id;
    }
  }
  return impl_->model->TokenToId(token);
}

int32_t Tokenizer::IdLimit() const { return impl_->id_limit; }

}  // namespace rp::workers::text
