// Job specs are JSON files mapped onto roundpipe.v1.JobSpec by protobuf's JSON parser (DESIGN
// §5): the shipped example parses, round-trips, and bad files give clear errors.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "roundpipe/v1/config.pb.h"
#include "roundpipe/v1/jobs.pb.h"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(JobSpecJson, TheShippedExampleParses) {
  const std::string json = ReadFile(RP_SOURCE_DIR "/deploy/examples/job-qwen3-tiny.json");
  ASSERT_FALSE(json.empty());
  roundpipe::v1::JobSpec spec;
  auto st = google::protobuf::util::JsonStringToMessage(json, &spec);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(spec.model().family(), "qwen3");
  EXPECT_EQ(spec.model().num_blocks(), 4);
  EXPECT_TRUE(spec.model().tied_embeddings());
  EXPECT_EQ(spec.precision(), roundpipe::v1::PRECISION_BF16);
  EXPECT_EQ(spec.optimizer().mode(), roundpipe::v1::OPTIMIZER_MODE_ASYNC);
  EXPECT_EQ(spec.optimizer().lr_schedule().kind(), roundpipe::v1::LrScheduleSpec::KIND_WARMUP_COSINE);
  EXPECT_EQ(spec.optimizer().lr_schedule().total_steps(), 200);
  EXPECT_EQ(spec.batching().global_batch(), 8);
  EXPECT_TRUE(spec.data().stream());
  EXPECT_EQ(spec.max_steps(), 200);
  // Round trip through JSON.
  std::string out;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec, &out).ok());
  roundpipe::v1::JobSpec again;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), spec.SerializeAsString());
}

TEST(JobSpecJson, BadFilesAreClearErrors) {
  roundpipe::v1::JobSpec spec;
  auto unknown = google::protobuf::util::JsonStringToMessage(R"({"modle": {}})", &spec);
  EXPECT_FALSE(unknown.ok());
  EXPECT_NE(std::string(unknown.message()).find("modle"), std::string::npos) << unknown.ToString();
  EXPECT_FALSE(google::protobuf::util::JsonStringToMessage(R"({"precision": "PRECISION_FP8"})", &spec).ok());
  EXPECT_FALSE(google::protobuf::util::JsonStringToMessage(R"({"batching": {"globalBatch": "many"}})", &spec).ok());
  EXPECT_FALSE(google::protobuf::util::JsonStringToMessage("{not json", &spec).ok());
  roundpipe::v1::DaemonConfig cfg;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"listen": ["127.0.0.1:0"], "devices": "cpu:2", "allowedRoots": ["/data"]})", &cfg)
                  .ok());
  EXPECT_EQ(cfg.allowed_roots(0), "/data");
}

}  // namespace
