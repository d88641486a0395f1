// jsonl_documents_test — JSONL datasets: the packed stream and loss mask equal what PyPI
// `tokenizers` gives for the same records (make_jsonl_dataset.py); bad records are refused naming
// file, line and field; shuffled windows are a fresh permutation each epoch, the same on every run;
// token dataset files written by `prepare` from chat hold what transformers' chat template gives.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "nlohmann/json.hpp"
#include "scheduler/runtime/jsonl_documents.h"
#include "scheduler/runtime/token_dataset.h"
#include "scheduler/runtime/token_dataset_file.h"
#include "tests/support/oracle_cache.h"
#include "tests/support/run_command.h"

namespace rp::scheduler::runtime {
namespace {

using rp::testing::RunCommand;
const auto& ReadAll = rp::testing::ReadWholeFile;

// The fixture, made once for every test process (read only).
const std::string& Fixture() {
  static const std::string dir = [] {
    auto made = rp::testing::CachedOracle(RP_VENV_PYTHON, RP_TEST_DIR "/make_jsonl_dataset.py");
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *made : std::string("/nonexistent");
  }();
  return dir;
}

TEST(JsonlDocuments, PackedStreamAndMaskEqualTokenizers) {
  auto tok = LoadTokenizerDir(Fixture() + "/tok", "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_TRUE(tok->eos_id.has_value());  // from tokenizer_config.json's {"content": "<|eos|>"}
  auto packed = ReadJsonlDocuments(Fixture() + "/train.jsonl", *tok);
  ASSERT_TRUE(packed.ok()) << packed.status();
  const auto want = nlohmann::json::parse(ReadAll(Fixture() + "/expected.json"));
  EXPECT_EQ(packed->documents, 120);
  EXPECT_EQ(packed->tokens, want["tokens"].get<std::vector<int32_t>>());
  EXPECT_EQ(packed->trained, want["trained"].get<std::vector<uint8_t>>());
}

TEST(JsonlDocuments, BadRecordsNameFileLineAndField) {
  auto tok = LoadTokenizerDir(Fixture() + "/tok", "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string path = ::testing::TempDir() + "rp_bad_" + std::to_string(getpid()) + ".jsonl";
  auto error_of = [&](const std::string& body) {
    std::ofstream(path) << body;
    auto p = ReadJsonlDocuments(path, *tok);
    return p.ok() ? std::string("(accepted)") : std::string(p.status().message());
  };
  EXPECT_NE(error_of("{\"text\": \"a\"}\n{\"text\": \"b\"\n").find("line 2: not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("{\"text\": 5}\n").find("line 1: field \"text\" must be a string"), std::string::npos);
  EXPECT_NE(error_of("\n{\"prompt\": \"q\"}\n")
                .find("line 2: needs a string \"text\", or strings \"prompt\" and "
                      "\"completion\" (it has: prompt)"),
            std::string::npos);
  EXPECT_NE(error_of("[1, 2]\n").find("line 1: not a JSON object"), std::string::npos);
  EXPECT_NE(error_of("\n\n").find("holds no records"), std::string::npos);
  EXPECT_NE(error_of("{\"text\": \"\xff\"}\n").find("line 1: not valid JSON"), std::string::npos);  // not UTF-8
  EXPECT_NE(error_of("{\"prompt\": \"q\", \"completion\": null}").find("\"completion\" must be a string"),
            std::string::npos);
  std::remove(path.c_str());
  EXPECT_FALSE(ReadJsonlDocuments(path, *tok).ok());  // gone
  auto bad_eos = LoadTokenizerDir(Fixture() + "/tok", "<|nope|>");
  ASSERT_FALSE(bad_eos.ok());
  EXPECT_NE(std::string(bad_eos.status().message()).find("eos_token '<|nope|>' is not a token"), std::string::npos);
  EXPECT_FALSE(LoadTokenizerDir(Fixture(), "").ok());  // no tokenizer.json there
}

TEST(JsonlDocuments, ManyRecordsAreTokenizedInParallelExactlyAsInOrder) {
  auto tok = LoadTokenizerDir(Fixture() + "/tok", "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string path = ::testing::TempDir() + "rp_many_" + std::to_string(getpid()) + ".jsonl";
  std::vector<int32_t> want;
  {
    std::ofstream f(path);
    for (int i = 0; i < 3000; ++i) {
      const std::string text = "the cat " + std::to_string(i) + (i % 7 ? " sat" : " \u00fcber");
      f << "{\"text\": \"" << text << "\"}\n";
      auto ids = tok->tokenizer.Encode(i % 7 ? text
                                             : "the cat " + std::to_string(i) +
                                                   " \xc3\xbc"
                                                   "ber",
                                       true);
      want.insert(want.end(), ids.begin(), ids.end());
      want.push_back(*tok->eos_id);
    }
  }
  auto packed = ReadJsonlDocuments(path, *tok);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->documents, 3000);
  EXPECT_EQ(packed->tokens, want);
  // Two bad records in different chunks: the first one is reported, as a sequential pass would.
  {
    std::ofstream f(path);
    for (int i = 1; i <= 3000; ++i) f << (i == 700 || i == 2500 ? "{\"text\": 1}" : "{\"text\": \"ok\"}") << "\n";
  }
  auto bad = ReadJsonlDocuments(path, *tok);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("line 700: field \"text\" must be a string"), std::string::npos)
      << bad.status();
  std::remove(path.c_str());
}

// Host-memory admission counts a tokenizer.json parse while it runs: kTokenizerParsePeakFactor x
// the file's bytes, given back when the parse ends (what the tokenizer keeps is resident and
// MemAvailable shows it), also when the parse fails.
TEST(JsonlDocuments, ATokenizerParseInFlightIsReservedForAdmission) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("rp_tok_reserve_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  int64_t file_bytes = 0;
  {
    std::ofstream f(dir / "tokenizer.json");
    f << "{\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {";
    for (int i = 0; i < 400000; ++i) f << (i ? ", " : "") << "\"tok" << i << "\": " << i;
    f << "}}}";
    file_bytes = static_cast<int64_t>(f.tellp());
  }
  ASSERT_EQ(TokenizerParseBytesInFlight(), 0);
  for (const bool broken : {false, true}) {
    if (broken) std::ofstream(dir / "tokenizer.json", std::ios::app) << "garbage";
    std::atomic<bool> done{false};
    int64_t seen = 0;
    std::thread reader([&] {
      while (!done) seen = std::max(seen, TokenizerParseBytesInFlight());
    });
    auto tok = LoadTokenizerDir(dir.string(), "");
    done = true;
    reader.join();
    EXPECT_EQ(tok.ok(), !broken) << tok.status();
    EXPECT_EQ(seen, (file_bytes + (broken ? 7 : 0)) * kTokenizerParsePeakFactor);
    EXPECT_EQ(TokenizerParseBytesInFlight(), 0) << "the reservation ends with the parse";
  }
  std::filesystem::remove_all(dir);
}

TEST(TokenDataset, MaskedTargetsBecomeTheIgnoreLabel) {
  std::vector<int32_t> tokens{10, 11, 12, 13, 14, 15, 16, 17, 18};
  std::vector<uint8_t> trained{0, 0, 1, 1, 0, 1, 1, 1, 1};
  auto d = TokenDataset::FromPacked(tokens, trained, 2, 4, "test");
  ASSERT_TRUE(d.ok()) << d.status();
  auto [t, l] = (*d)->Batch(0);
  EXPECT_EQ(std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + 8),
            (std::vector<int64_t>{10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + 8),
            (std::vector<int64_t>{-100, 12, 13, -100, 15, 16, 17, 18}));
}

TEST(TokenDataset, ShuffledWindowsAreAFreshPermutationEachEpochAndRepeatable) {
  const int64_t S = 3, B = 5, windows = 103;  // 103 windows: 20 batches, 3 windows dropped per epoch
  std::vector<int32_t> tokens(windows * S + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
  auto a = *TokenDataset::FromPacked(tokens, std::vector<uint8_t>(tokens.size(), 1), B, S, "test");
  auto b = *TokenDataset::FromPacked(tokens, std::vector<uint8_t>(tokens.size(), 1), B, S, "test");
  a->Shuffle(42);
  b->Shuffle(42);
  ASSERT_EQ(a->batches_per_epoch(), 20);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t i = 0; i < 40; ++i) {
    for (int64_t r = 0; r < B; ++r) {
      const int64_t w = a->WindowOf(i, r);
      ASSERT_GE(w, 0);
      ASSERT_LT(w, windows);
      (i < 20 ? epoch0 : epoch1).push_back(w);
      EXPECT_EQ(w, b->WindowOf(i, r));  // a pure function of the index: a resumed job continues it
    }
  }
  EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), 100u);  // no window twice
  EXPECT_EQ(std::set<int64_t>(epoch1.begin(), epoch1.end()).size(), 100u);
  EXPECT_NE(epoch0, epoch1);
  std::vector<int64_t> in_order(100);
  for (int64_t k = 0; k < 100; ++k) in_order[k] = k;
  EXPECT_NE(epoch0, in_order);
  auto [t, l] = a->Batch(3);  // the batch's rows are its windows
  EXPECT_EQ(t.data_ptr<int64_t>()[0], a->WindowOf(3, 0) * S);
  EXPECT_EQ(l.data_ptr<int64_t>()[0], a->WindowOf(3, 0) * S + 1);
  b->Shuffle(43);
  EXPECT_NE(a->WindowOf(0, 0) * 1000 + a->WindowOf(0, 1), b->WindowOf(0, 0) * 1000 + b->WindowOf(0, 1));
}

// A tokenizer whose Split pattern backtracks, and a JSONL whose second record makes it work for
// minutes: the read is bounded per record (failing naming the file and line) and stops at once
// when the job's flag is raised. A record nested too deep is refused naming its line.
TEST(JsonlDocuments, ARunawayRecordIsBoundedAndAStopEndsTheReadAtOnce) {
  const std::string d = ::testing::TempDir() + "rp_runaway_" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  {
    std::ofstream(d + "/tokenizer.json")
        << "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?:a+)+b|.\"}, "
           "\"behavior\": \"Isolated\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \" \": 2, "
           "\"o\": 3, \"k\": 4}, \"merges\": []}}";
    std::string runs;
    while (runs.size() < 100000) runs += "aaaaaaaaaaaaaaaaaa ";
    std::ofstream f(d + "/data.jsonl");
    f << "{\"text\": \"ok\"}\n{\"text\": \"" << runs << "\"}\n";
    std::string deep(100000, '[');
    f.close();
    std::ofstream(d + "/deep.jsonl") << "{\"text\": \"ok\"}\n\n{\"text\": \"ok\", \"x\": " << deep << "}\n";
  }
  auto tok = LoadTokenizerDir(d, "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  JsonlLimits tight;
  tight.min_record_seconds = 0.3;
  tight.min_bytes_per_second = 1e12;
  auto start = std::chrono::steady_clock::now();
  auto over = ReadJsonlDocuments(d + "/data.jsonl", *tok, tight);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("data.jsonl' line 2: tokenizing took more than its budget of 0.3 s"),
            std::string::npos)
      << over.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  std::atomic<bool> stop{false};
  JsonlLimits stoppable;
  stoppable.stop = &stop;
  std::thread raiser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
  });
  start = std::chrono::steady_clock::now();
  auto stopped = ReadJsonlDocuments(d + "/data.jsonl", *tok, stoppable);
  raiser.join();
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  auto deep = ReadJsonlDocuments(d + "/deep.jsonl", *tok);
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("deep.jsonl' line 3: JSON nested deeper than 64 levels"), std::string::npos)
      << deep.status();
  std::filesystem::remove_all(d);
}

// A long read says how far it is: the records tokenized so far and in all, while it runs, in
// order (what the job's "tokenizing <file>: n of N records" progress shows).
TEST(JsonlDocuments, ALongReadReportsItsProgress) {
  const std::string d = ::testing::TempDir() + "rp_progress_" + std::to_string(getpid());
  std::filesystem::create_directories(d);
  std::ofstream(d + "/tokenizer.json")
      << "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?:a+)+b|.\"}, "
         "\"behavior\": \"Isolated\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \" \": 2}, "
         "\"merges\": []}}";
  std::string runs;
  while (runs.size() < 4000) runs += "aaaaaaaaaaaaaaaaaa ";  // ~0.3 s of backtracking per record
  {
    std::ofstream f(d + "/data.jsonl");
    for (int r = 0; r < 8; ++r) f << "{\"text\": \"" << runs << "\"}\n";
  }
  auto tok = LoadTokenizerDir(d, "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<std::pair<int64_t, int64_t>> reports;
  JsonlLimits limits;
  limits.progress_every = std::chrono::milliseconds(50);
  limits.progress = [&](int64_t done, int64_t records) { reports.emplace_back(done, records); };
  auto read = ReadJsonlDocuments(d + "/data.jsonl", *tok, limits);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_GE(reports.size(), 3u);
  bool midway = false;
  for (size_t k = 0; k < reports.size(); ++k) {
    EXPECT_EQ(reports[k].second, 8);
    EXPECT_LE(reports[k].first, 8);
    if (k > 0) {
      EXPECT_GE(reports[k].first, reports[k - 1].first);
    }
    midway = midway || (reports[k].first > 0 && reports[k].first < 8);
  }
  EXPECT_TRUE(midway) << "reported while the read ran";
  std::filesystem::remove_all(d);
}

TEST(TokenDatasetFile, PreparedChatHoldsTransformersTokensAndAssistantMask) {
  auto made = rp::testing::CachedOracle(RP_VENV_PYTHON, RP_TEST_DIR "/make_chat_dataset.py", " " RP_CLIENT_PY_DIR,
                                        {RP_CLIENT_PY_DIR "/roundpipe_prepare.py"});
  ASSERT_TRUE(made.ok()) << made.status();
  const std::string d = *made;
  const auto want = nlohmann::json::parse(ReadAll(d + "/expected.json"));
  for (const char* name : {"markers", "plain"}) {  // transformers' mask, and our prefix rule
    auto packed = ReadTokenDatasetFile(d + "/" + name + ".safetensors");
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_EQ(packed->tokens, want["tokens"].get<std::vector<int32_t>>()) << name;
    EXPECT_EQ(packed->trained, want["trained"].get<std::vector<uint8_t>>()) << name;
    EXPECT_EQ(packed->documents, 40) << name;
  }
}

TEST(TokenDatasetFile, BadFilesAreRefusedNamingTheTensor) {
  const std::string d = ::testing::TempDir() + "rp_tdf_" + std::to_string(getpid());
  std::string out;
  const std::string py =
      std::string(RP_VENV_PYTHON) + " -c \"import numpy as np, sys; from safetensors.numpy import " +
      "save_file; d = sys.argv[1]; i = np.arange(10, dtype=np.int32); m = {'format': 'roundpipe.token_dataset.v1'}; " +
      "save_file({'tokens': i}, d + '/noids.safetensors', metadata=m); " +
      "save_file({'input_ids': i, 'loss_mask': np.ones(9, np.uint8)}, d + '/mask.safetensors', metadata=m); " +
      "save_file({'input_ids': i, 'document_offsets': np.array([0, 7, 5, 10])}, d + '/off.safetensors', " +
      "metadata=m); " + "save_file({'input_ids': i.astype(np.float32)}, d + '/float.safetensors', metadata=m); " +
      "w = i.astype(np.int64); w[3] = 2**32 + 5; save_file({'input_ids': w}, d + '/wrap.safetensors', metadata=m); " +
      "w[3] = -2; save_file({'input_ids': w}, d + '/negative.safetensors', metadata=m); " +
      "save_file({'input_ids': i}, d + '/noformat.safetensors'); " +
      "save_file({'input_ids': i}, d + '/otherformat.safetensors', metadata={'format': 'pt'}); " +
      "k = np.zeros(10, np.int32); k[4] = 256; " +
      "save_file({'input_ids': i, 'loss_mask': k}, d + '/mask256.safetensors', metadata=m)\" " + d;
  ASSERT_EQ(RunCommand("mkdir -p " + d + " && " + py, &out), 0) << out;
  auto error_of = [&](const std::string& f) {
    auto st = CheckTokenDatasetFile(d + "/" + f);
    if (st.ok()) {
      auto p = ReadTokenDatasetFile(d + "/" + f);
      return p.ok() ? std::string("(accepted)") : std::string(p.status().message());
    }
    return std::string(st.message());
  };
  EXPECT_NE(error_of("noids.safetensors").find("has no input_ids"), std::string::npos) << error_of("noids.safetensors");
  EXPECT_NE(error_of("mask.safetensors").find("loss_mask must be"), std::string::npos) << error_of("mask.safetensors");
  EXPECT_NE(error_of("off.safetensors").find("document_offsets must rise from 0 to 10 (entry 2 is 5)"),
            std::string::npos)
      << error_of("off.safetensors");
  EXPECT_NE(error_of("float.safetensors").find("int32 or int64"), std::string::npos) << error_of("float.safetensors");
  EXPECT_FALSE(CheckTokenDatasetFile(d + "/missing.safetensors").ok());
  // Nothing wraps: an int64 id of 2^32 + 5 is not token 5, and -2 is not a token.
  EXPECT_NE(error_of("wrap.safetensors").find("wrap.safetensors': input_ids[3] is 4294967301"), std::string::npos)
      << error_of("wrap.safetensors");
  EXPECT_NE(error_of("negative.safetensors").find("input_ids[3] is -2"), std::string::npos)
      << error_of("negative.safetensors");
  // The format is the one this reader knows, by its metadata.
  EXPECT_NE(error_of("noformat.safetensors").find("\"format\" must be \"roundpipe.token_dataset.v1\" (it is absent)"),
            std::string::npos)
      << error_of("noformat.safetensors");
  EXPECT_NE(error_of("otherformat.safetensors").find("(it is \"pt\")"), std::string::npos)
      << error_of("otherformat.safetensors");
  // An int32 mask of 256 trains its token (a narrowing to uint8 would have made it 0).
  auto masked = ReadTokenDatasetFile(d + "/mask256.safetensors");
  ASSERT_TRUE(masked.ok()) << masked.status();
  // A long step of a starting job: a raised stop (cancel, pause, drain) ends the read.
  std::atomic<bool> stop{true};
  EXPECT_EQ(ReadTokenDatasetFile(d + "/mask256.safetensors", &stop).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(masked->trained, (std::vector<uint8_t>{0, 0, 0, 0, 1, 0, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace rp::scheduler::runtime
