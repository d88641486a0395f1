// The daemon's TensorBoard event files (server/tensorboard/) read back by PyPI tensorboard's own
// readers (read_tfevents.py): scalars, text and hyperparameters as written; a resume trims the
// steps that run again; a torn last record is cut; hostile directories (a symlink, a FIFO, a
// huge file) are left alone; a write that fails (file size limit) leaves the file readable.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/tensorboard/crc32c.h"
#include "server/tensorboard/event_log.h"
#include "server/tensorboard/record_file.h"
#include "tests/support/run_command.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tensorboard_reader.h"

namespace rp::tensorboard {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json ReadWithTensorBoard(const fs::path& dir) { return rp::testing::ReadTensorBoard(dir.string()); }
std::vector<std::pair<int64_t, double>> Series(const json& j, const std::string& tag) {
  return rp::testing::TensorBoardSeries(j, tag);
}

std::vector<std::pair<int64_t, double>> Expected(int64_t first, int64_t last, double scale) {
  std::vector<std::pair<int64_t, double>> s;
  for (int64_t k = first; k <= last; ++k) s.emplace_back(k, static_cast<double>(static_cast<float>(scale * k)));
  return s;
}

void LogSteps(EventLog& log, int64_t first, int64_t last) {
  for (int64_t k = first; k <= last; ++k) {
    ASSERT_TRUE(log.AddScalars(k, {{"train/loss", 0.5 * k}, {"train/learning_rate", 1e-4 * k}}, 1.7e9 + k).ok());
  }
}

TEST(TensorBoardCrc, MatchesTheStandardCheckValueAndTensorBoardsMask) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the published CRC-32C check value
  EXPECT_EQ(Crc32c("456789", Crc32c("123")), 0xE3069283u);
  const json j = ReadWithTensorBoard(rp::testing::FreshTempDir("tb", "crc"));
  EXPECT_EQ(j.value("masked_crc_123456789", int64_t{-1}), static_cast<int64_t>(MaskCrc(Crc32c("123456789"))));
}

TEST(TensorBoardLog, ScalarsTextAndHParamsReadBackByTensorBoard) {
  const fs::path root = rp::testing::FreshTempDir("tb", "roundtrip");
  {
    auto log = EventLog::Open((root / "tensorboard").string(), {0});
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)
                    ->AddHParams({{"optimizer.lr", 3e-4}, {"model.preset", std::string("qwen3-tiny")}, {"lora", true}},
                                 "job-000001", 1.7e9)
                    .ok());
    LogSteps(**log, 1, 5);
    ASSERT_TRUE((*log)->AddText(5, "samples/0", "**prompt** hello\n\nworld", 1.7e9).ok());
  }
  const json j = ReadWithTensorBoard(root / "tensorboard");
  EXPECT_EQ(Series(j, "train/loss"), Expected(1, 5, 0.5));
  EXPECT_EQ(Series(j, "train/learning_rate"), Expected(1, 5, 1e-4));
  ASSERT_TRUE(j["texts"].contains("samples/0"));
  EXPECT_EQ(j["texts"]["samples/0"], json::parse(R"([[5, "**prompt** hello\n\nworld"]])"));
  EXPECT_EQ(j["hparams"]["optimizer.lr"].get<double>(), 3e-4);
  EXPECT_EQ(j["hparams"]["model.preset"].get<std::string>(), "qwen3-tiny");
  EXPECT_EQ(j["hparams"]["lora"].get<bool>(), true);
  // TensorBoard's accumulator files them under its dashboards' plugins.
  EXPECT_EQ(j["plugins"]["text"], json::parse(R"(["samples/0"])"));
  EXPECT_EQ(j["plugins"]["hparams"], json::parse(R"(["_hparams_/session_start_info"])"));
}

TEST(TensorBoardLog, AResumeDropsTheStepsThatRunAgainAndKeepsTheRest) {
  const fs::path dir = rp::testing::FreshTempDir("tb", "resume") / "tensorboard";
  {
    auto log = EventLog::Open(dir.string(), {0});
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->AddHParams({{"seed", 1.0}}, "g", 1.7e9).ok());
    LogSteps(**log, 1, 10);
    // Evaluations at steps 3 and 6; the checkpoint of step 6 was written before the one at 6.
    ASSERT_TRUE((*log)->AddScalars(3, {{"eval/loss", 3.0}}, 1.7e9).ok());
    ASSERT_TRUE((*log)->AddScalars(6, {{"eval/loss", 6.0}}, 1.7e9).ok());
  }
  {
    // Resumed from the checkpoint of step 6: steps 7.. and the evaluation at 6 run again.
    auto log = EventLog::Open(dir.string(), {6, {"eval/", "samples/"}});
    ASSERT_TRUE(log.ok()) << log.status();
    EXPECT_EQ((*log)->dropped_records(), 5);
    ASSERT_TRUE((*log)->AddScalars(6, {{"eval/loss", 6.0}}, 1.7e9).ok());
    ASSERT_TRUE((*log)->AddHParams({{"seed", 1.0}}, "g", 1.7e9).ok());  // already there: not again
    LogSteps(**log, 7, 12);
  }
  const json j = ReadWithTensorBoard(dir);
  EXPECT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(Series(j, "train/loss"), Expected(1, 12, 0.5));  // no step twice, none missing
  EXPECT_EQ(Series(j, "eval/loss"), (std::vector<std::pair<int64_t, double>>{{3, 3.0}, {6, 6.0}}));
  EXPECT_EQ(j["hparams"].size(), 1u);
  EXPECT_EQ(j["plugins"]["hparams"].size(), 1u);
}

TEST(TensorBoardLog, ATornLastRecordIsCutOnOpen) {
  const fs::path dir = rp::testing::FreshTempDir("tb", "torn") / "tensorboard";
  std::string first_file;
  {
    auto log = EventLog::Open(dir.string(), {0});
    ASSERT_TRUE(log.ok());
    LogSteps(**log, 1, 3);
    first_file = (*log)->file_path();
  }
  // A writer killed mid-record: half of step 4's record at the end.
  const std::string whole = FrameRecord("a record that was being written when the daemon died");
  {
    std::ofstream f(first_file, std::ios::binary | std::ios::app);
    f << whole.substr(0, whole.size() / 2);
  }
  EXPECT_TRUE(ParseRecords(rp::testing::ReadWholeFile(first_file)).damaged_tail);
  {
    auto log = EventLog::Open(dir.string(), {3});
    ASSERT_TRUE(log.ok());
    ASSERT_EQ((*log)->notes().size(), 1u);
    EXPECT_NE((*log)->notes()[0].find("damaged last record"), std::string::npos) << (*log)->notes()[0];
    LogSteps(**log, 4, 5);
  }
  EXPECT_FALSE(ParseRecords(rp::testing::ReadWholeFile(first_file)).damaged_tail);
  EXPECT_EQ(Series(ReadWithTensorBoard(dir), "train/loss"), Expected(1, 5, 0.5));
}

TEST(TensorBoardLog, HostileEntriesAreLeftAloneAndASymlinkedDirectoryIsRefused) {
  const fs::path root = rp::testing::FreshTempDir("tb", "hostile");
  const fs::path dir = root / "tensorboard";
  fs::create_directories(dir);
  ASSERT_EQ(::mkfifo((dir / "events.out.tfevents.1.fifo").c_str(), 0600), 0);  // would block a reader
  fs::create_symlink("/etc/passwd", dir / "events.out.tfevents.2.link");
  {
    const int fd = ::open((dir / "events.out.tfevents.3.huge").c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, EventLog::kMaxRewriteBytes + 1), 0);  // sparse: costs no disk
    ::close(fd);
  }
  auto log = EventLog::Open(dir.string(), {0});
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ((*log)->notes().size(), 3u);
  EXPECT_EQ(fs::read_symlink(dir / "events.out.tfevents.2.link"), "/etc/passwd");
  EXPECT_EQ(fs::file_size(dir / "events.out.tfevents.3.huge"), static_cast<uintmax_t>(EventLog::kMaxRewriteBytes + 1));
  // The log's own directory may not be a symlink (it could point anywhere).
  fs::create_directories(root / "elsewhere");
  fs::create_symlink(root / "elsewhere", root / "linked");
  auto refused = EventLog::Open((root / "linked").string(), {0});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not a symlink"), std::string::npos) << refused.status();
  EXPECT_TRUE(fs::is_empty(root / "elsewhere"));
}

TEST(TensorBoardLog, AFailedWriteLeavesTheFileReadable) {
  const fs::path dir = rp::testing::FreshTempDir("tb", "full") / "tensorboard";
  auto log = EventLog::Open(dir.string(), {0});
  ASSERT_TRUE(log.ok());
  LogSteps(**log, 1, 3);
  const auto good = fs::file_size((*log)->file_path());
  // The file may not grow past a few bytes more than it has: the next record fails part-way.
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit tight = old;
  tight.rlim_cur = good + 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tight), 0);
  const absl::Status st = (*log)->AddScalars(4, {{"train/loss", 2.0}}, 1.7e9);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find((*log)->file_path()), std::string::npos) << st;
  EXPECT_EQ(fs::file_size((*log)->file_path()), good);  // cut back to the last whole record
  LogSteps(**log, 4, 4);                                // and it goes on
  EXPECT_EQ(Series(ReadWithTensorBoard(dir), "train/loss"), Expected(1, 4, 0.5));
}

}  // namespace
}  // namespace rp::tensorboard
