// tokenizer_limits_test — tokenizer.json as a hostile client would write it: nesting deep enough
// to overflow any recursive reader, a Sequence chain whose error paths grow quadratically, a
// vocabulary whose one large id would size a table, ids that wrap when narrowed, and
// TemplateProcessing pieces of the wrong JSON type. Each is refused with InvalidArgument naming
// the part of the file, quickly and without allocating what the file does not hold.
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "nlohmann/json.hpp"
#include "workers/text/byte_level.h"
#include "workers/text/tokenizer.h"

namespace rp::workers::text {
namespace {

using nlohmann::json;

// A valid byte-level BPE file whose `section` is replaced by the raw text `value`.
std::string FileWith(const std::string& section, const std::string& value) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    ByteLevelEncode(std::string(1, static_cast<char>(b)), &s);
    vocab[s] = b;
  }
  json j{{"added_tokens", json::array()},
         {"normalizer", nullptr},
         {"pre_tokenizer", nullptr},
         {"post_processor", nullptr},
         {"decoder", nullptr},
         {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  j[section] = "@@HOLE@@";
  std::string text = j.dump();
  text.replace(text.find("\"@@HOLE@@\""), 10, value);
  return text;
}

std::string Nested(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(depth, ']'); }

int64_t HeapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

TEST(TokenizerLimits, DeepNestingAnywhereIsRefusedNotACrash) {
  // 200,000 nested arrays (400 KB): a recursive copy or walk of this overflows the stack.
  for (const char* section : {"normalizer", "added_tokens", "pre_tokenizer", "post_processor", "decoder", "model"}) {
    SCOPED_TRACE(section);
    auto t = Tokenizer::FromJson(FileWith(section, Nested(200000)));
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("nested deeper than 64 levels"), std::string::npos) << t.status();
  }
  // Brackets inside strings are text, not nesting: a deep-looking string value is fine.
  auto t = Tokenizer::FromJson(FileWith("normalizer", "{\"type\": \"NFC\", \"x\": \"" + Nested(1000) + "\"}"));
  EXPECT_TRUE(t.ok()) << t.status();
}

TEST(TokenizerLimits, ALongSequenceChainIsRefusedAtOnceWithoutGrowingPaths) {
  // 30,000 Sequence normalizers nested in one another: each level's error path is longer than
  // the last (quadratic strings) and the recursion is as deep as the chain.
  std::string chain;
  for (int i = 0; i < 30000; ++i) chain += "{\"type\": \"Sequence\", \"normalizers\": [";
  chain += "{\"type\": \"NFKC\"}";
  for (int i = 0; i < 30000; ++i) chain += "]}";
  const int64_t before = HeapBytes();
  const auto start = std::chrono::steady_clock::now();
  auto t = Tokenizer::FromJson(FileWith("normalizer", chain));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("nested deeper than 64 levels"), std::string::npos) << t.status();
  EXPECT_LT(HeapBytes() - before, int64_t{16} << 20);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // A chain within the bound still loads, and names the unsupported leaf by its path.
  std::string shallow;
  for (int i = 0; i < 3; ++i) shallow += "{\"type\": \"Sequence\", \"normalizers\": [";
  shallow += "{\"type\": \"NFKC\"}]}]}]}";
  auto s = Tokenizer::FromJson(FileWith("normalizer", shallow));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("normalizer.normalizers[0].normalizers[0].normalizers[0]: type 'NFKC'"),
            std::string::npos)
      << s.status();
}

TEST(TokenizerLimits, OneLargeIdCostsNoTableOfThatSize) {
  // A few hundred bytes naming id 2^24 - 1: the tokenizer holds what the file holds, not 2^24
  // entries (a 2^24-entry string table is 512 MiB).
  std::string vocab = "{\"a\": 0, \"b\": 1, \"z\": 16777215}";
  std::string text = "{\"model\": {\"type\": \"BPE\", \"vocab\": " + vocab + ", \"merges\": []}}";
  const int64_t before = HeapBytes();
  auto t = Tokenizer::FromJson(text);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_LT(HeapBytes() - before, int64_t{4} << 20) << "bytes held by a 3-token tokenizer";
  EXPECT_EQ(t->IdLimit(), 1 << 24);  // what the model's vocabulary is checked against at Submit
  EXPECT_EQ(t->Decode({16777215, 0}), "z a");
  EXPECT_EQ(t->Decode({5}), "");  // no token has id 5
}

TEST(TokenizerLimits, IdsThatWouldWrapAreRefusedNotNarrowed) {
  // 2^32 + 5 narrowed to int32 is 5; 2^31 is negative. Each is refused naming where it is.
  for (const char* id : {"4294967301", "2147483648", "-1", "16777216"}) {
    SCOPED_TRACE(id);
    auto v = Tokenizer::FromJson(std::string("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": ") + id +
                                 "}, \"merges\": []}}");
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find("model.vocab"), std::string::npos) << v.status();
    auto a = Tokenizer::FromJson(FileWith("added_tokens", std::string("[{\"id\": ") + id + ", \"content\": \"<x>\"}]"));
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find("added_tokens[0]"), std::string::npos) << a.status();
  }
}

TEST(TokenizerLimits, TemplateProcessingOfTheWrongTypesIsRefusedByField) {
  const std::string specials = "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [7], \"tokens\": [\"<s>\"]}}";
  struct Case {
    std::string post;
    std::string expect;
  };
  const Case cases[] = {
      {"{\"type\": \"TemplateProcessing\", \"single\": 5}", "post_processor: TemplateProcessing needs a 'single'"},
      {"{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": 5}}], " + specials + "}",
       "post_processor.single[0]: must be"},
      {"{\"type\": \"TemplateProcessing\", \"single\": [7], " + specials + "}", "post_processor.single[0]: must be"},
      {"{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], "
       "\"special_tokens\": {\"<s>\": {\"ids\": [\"seven\"]}}}",
       "special_tokens['<s>'].ids holds \"seven\""},
      {"{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], "
       "\"special_tokens\": {\"<s>\": {\"ids\": [4294967301]}}}",
       "special_tokens['<s>'].ids holds 4294967301"},
      {"{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}], "
       "\"special_tokens\": {\"<s>\": 3}}",
       "special token '<s>' has no 'ids' array"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.post);
    auto t = Tokenizer::FromJson(FileWith("post_processor", c.post));
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos) << t.status();
  }
  // A template's special-token ids count in IdLimit, so the model's vocabulary check covers them.
  auto t = Tokenizer::FromJson(
      FileWith("post_processor",
               "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, "
               "{\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {\"<s>\": {\"ids\": [999999]}}}"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->IdLimit(), 1000000);
  EXPECT_EQ(t->Encode("a", /*add_special_tokens=*/true).front(), 999999);
}

// A Split pattern that backtracks: `(?:a+)+b|.` on a run of 'a' without a 'b' tries every way to
// split the run at every position. Runs of 18 stay under PCRE2's match limit per call, so only a
// budget ends 200 KB of them (minutes unbounded); one long run passes the match limit.
std::string Runs() {
  std::string text;
  while (text.size() < 200000) text += "aaaaaaaaaaaaaaaaaa ";
  return text;
}
std::string Backtracking() {
  return FileWith("pre_tokenizer",
                  "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?:a+)+b|.\"}, \"behavior\": \"Isolated\"}");
}

TEST(TokenizerLimits, AStopEndsABacktrackingEncodeAtOnce) {
  auto t = Tokenizer::FromJson(Backtracking());
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string text = Runs();
  std::atomic<bool> stop{false};
  WorkLimits limits{&stop};
  std::thread raiser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stop = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto ids = t->Encode(text, false, limits);
  const auto took = std::chrono::steady_clock::now() - start;
  raiser.join();
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kCancelled) << ids.status();
  EXPECT_LT(took, std::chrono::seconds(3));
  // Raised before it starts: nothing is done.
  EXPECT_EQ(t->Encode("abc", false, limits).status().code(), absl::StatusCode::kCancelled);
}

TEST(TokenizerLimits, ABacktrackingEncodeEndsAtItsDeadline) {
  auto t = Tokenizer::FromJson(Backtracking());
  ASSERT_TRUE(t.ok()) << t.status();
  WorkLimits limits;
  limits.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  auto ids = t->Encode(Runs(), false, limits);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kDeadlineExceeded) << ids.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  // One run too long for PCRE2's match limit is refused naming the byte, not left unsplit.
  auto limit = t->Encode("xy" + std::string(100000, 'a'), false, WorkLimits{});
  ASSERT_FALSE(limit.ok());
  EXPECT_EQ(limit.status().code(), absl::StatusCode::kResourceExhausted) << limit.status();
  EXPECT_NE(limit.status().message().find("stopped at byte 2 of 100002"), std::string::npos) << limit.status();
  // Within its limits the bounded Encode gives the unbounded one's ids.
  WorkLimits roomy;
  roomy.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto bounded = t->Encode("ab aab xyz", true, roomy);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_EQ(*bounded, t->Encode("ab aab xyz", true));
}

}  // namespace
}  // namespace rp::workers::text
