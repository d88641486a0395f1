#include "workers/text/bpe_model.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "workers/text/byte_level.h"

namespace rp::workers::text {

absl::StatusOr<BpeModel> BpeModel::Create(std::unordered_map<std::string, int32_t> vocab,
                                          const std::vector<std::pair<std::string, std::string>>& merges,
                                          Options options) {
  BpeModel m;
  // id -> token kept in a hash map: memory follows the entries, never the largest id (a file of a
  // few bytes naming id 2^24 - 1 must not cost a 2^24-entry table).
  m.id_to_token_.reserve(vocab.size());
  for (const auto& [tok, id] : vocab) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("model.vocab: token '", tok, "' has negative id ", id));
    if (id >= (1 << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab: id ", id, " of '", tok, "' is beyond 2^24 (not a real vocabulary)"));
    }
    auto [it, fresh] = m.id_to_token_.emplace(id, tok);
    if (!fresh) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab: id ", id, " is given to both '", it->second, "' and '", tok, "'"));
    }
    m.id_limit_ = std::max(m.id_limit_, id + 1);
  }
  m.merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = vocab.find(a), ib = vocab.find(b), ic = vocab.find(a + b);
    if (ia == vocab.end() || ib == vocab.end() || ic == vocab.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model.merges[", r, "] ('", a, "', '", b, "'): '",
                                                     ia == vocab.end()   ? a
                                                     : ib == vocab.end() ? b
                                                                         : a + b,
                                                     "' is not in the vocabulary"));
    }
    // A repeated pair takes its last rank: `tokenizers` collects the merges into a map the same way.
    m.merges_.insert_or_assign(PairKey(ia->second, ib->second), Merge{static_cast<int32_t>(r), ic->second});
  }
  if (options.unk_token) {
    auto it = vocab.find(*options.unk_token);
    if (it == vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.unk_token '", *options.unk_token, "' is not in the vocabulary"));
    }
    m.unk_id_ = it->second;
  }
  m.vocab_ = std::move(vocab);
  m.options_ = std::move(options);
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string_view BpeModel::IdToToken(int32_t id) const {
  auto it = id_to_token_.find(id);
  return it == id_to_token_.end() ? std::string_view() : std::string_view(it->second);
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = TokenToId(word)) {
      out->push_back(*id);
      return;
    }
  }
  // Symbols: one per character, linked so that merging is O(1); the heap holds candidate merges.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  std::string ch;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    NextCodepoint(word, &i);
    ch.assign(word.substr(start, i - start));
    auto it = vocab_.find(ch);
    int32_t id = -1;
    if (it != vocab_.end()) {
      id = it->second;
    } else if (unk_id_) {
      if (options_.fuse_unk && !sym.empty() && sym.back().id == *unk_id_) continue;
      id = *unk_id_;
    } else {
      continue;  // dropped, as `tokenizers` does without an unk token
    }
    const int32_t n = static_cast<int32_t>(sym.size());
    sym.push_back(Symbol{id, n - 1, -1, true});
    if (n > 0) sym[n - 1].next = n;
  }
  struct Candidate {
    int32_t rank, pos, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t pos) {
    const int32_t nx = sym[pos].next;
    if (nx < 0) return;
    auto it = merges_.find(PairKey(sym[pos].id, sym[nx].id));
    if (it != merges_.end()) heap.push(Candidate{it->second.rank, pos, it->second.result});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    auto it = merges_.find(PairKey(left.id, sym[left.next].id));
    if (it == merges_.end() || it->second.result != c.result) continue;  // stale candidate
    Symbol& right = sym[left.next];
    right.alive = false;
    left.id = c.result;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

}  // namespace rp::workers::text
