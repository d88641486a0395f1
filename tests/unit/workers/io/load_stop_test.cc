// load_stop_test — loading a model's weights is one of a job's long steps: a stop raised by
// another thread (the job's cancel, pause, or a daemon drain: EngineJob::stop_starting) ends it
// between tensors with Cancelled, naming the directory; unraised, the load is the usual one; a
// load reports its progress after every tensor.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>

#include "tests/unit/workers/io/hf_models_fixture.h"
#include "workers/io/hf_config.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {
namespace {

TEST_F(HfModels, ARaisedStopEndsAWeightLoadBetweenTensors) {
  const std::string dir = dir_ + "/llama";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  std::atomic<bool> stop{true};
  HostModelStore stopped(*cfg, at::kFloat, 1);
  const absl::Status st = LoadHfWeights(dir, &stopped, nullptr, &stop);
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_NE(st.message().find("loading weights from '" + dir + "' was stopped"), std::string::npos) << st;
  stop = false;
  HostModelStore loaded(*cfg, at::kFloat, 1);
  ASSERT_TRUE(LoadHfWeights(dir, &loaded, nullptr, &stop).ok());
  HostModelStore plain(*cfg, at::kFloat, 1);
  std::vector<int> reported;  // the load says how far it is: every count once, in order, to the end
  ASSERT_TRUE(LoadHfWeights(dir, &plain, nullptr, nullptr, [&](int done, int params) {
                EXPECT_EQ(params, plain.num_params());
                reported.push_back(done);
              }).ok());
  ASSERT_EQ(reported.size(), static_cast<size_t>(plain.num_params()));
  for (size_t k = 0; k < reported.size(); ++k) EXPECT_EQ(reported[k], static_cast<int>(k) + 1);
  for (int i = 0; i < plain.num_params(); ++i) {
    EXPECT_TRUE(at::equal(loaded.param(i).master, plain.param(i).master)) << plain.param(i).name;
  }
}

}  // namespace
}  // namespace rp::workers::io
