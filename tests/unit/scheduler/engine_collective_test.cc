// Gloo collectives and LibTorch training in one process: a 2-rank communicator group runs
// all-reduces (in its roundpipe-comm processes) while the engine trains a job here; the job's
// losses equal the same job's alone, and every all-reduce's result is exact.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/support/engine_values.h"
#include "tests/unit/scheduler/engine_test_jobs.h"
#include "workers/collective/communicator.h"

namespace rp::scheduler {
namespace {

namespace wc = workers::collective;

std::vector<double> Losses(Engine& e) {
  auto id = e.Submit(TinyJob());
  EXPECT_TRUE(id.ok());
  for (uint64_t b = 0; b < 4; ++b) EXPECT_TRUE(e.FeedBatch(*id, rp::testing::ToBatch(RandomTokens(4, 8, 41, b))).ok());
  EXPECT_TRUE(e.CloseInput(*id).ok());
  std::vector<double> out;
  for (const JobEvent& ev : DrainUntilEnded(e, *id)) {
    if (ev.kind == JobEvent::Kind::kIteration) out.push_back(ev.stats.loss);
  }
  return out;
}

TEST(EngineWithCollectives, TrainingAndGlooCollectivesShareOneProcess) {
  auto engine = Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  const std::vector<double> alone = Losses(**engine);
  ASSERT_EQ(alone.size(), 4u);

  rp::spec::InMemoryStore store;
  std::unique_ptr<wc::Communicator> comms[2];
  {
    std::thread peer([&] {
      wc::CommunicatorOptions o{RP_COMM_BINARY, 1, 2, "127.0.0.1", 4096 * 4, std::chrono::seconds(20), "beside"};
      auto c = wc::Communicator::Start(o, &store);
      ASSERT_TRUE(c.ok()) << c.status();
      comms[1] = std::move(*c);
    });
    wc::CommunicatorOptions o{RP_COMM_BINARY, 0, 2, "127.0.0.1", 4096 * 4, std::chrono::seconds(20), "beside"};
    auto c = wc::Communicator::Start(o, &store);
    peer.join();
    ASSERT_TRUE(c.ok()) << c.status();
    comms[0] = std::move(*c);
    ASSERT_NE(comms[1], nullptr);
  }
  std::atomic<bool> training{true};
  std::atomic<int> rounds{0};
  std::atomic<int> wrong{0};
  std::thread reducer([&] {
    while (training || rounds < 20) {
      for (int r = 0; r < 2; ++r) {
        for (int i = 0; i < 4096; ++i) comms[r]->data()[i] = static_cast<float>(i * (r + 1) + rounds);
      }
      absl::Status st[2];
      std::thread other([&] { st[1] = comms[1]->Run({wc::CollectiveOp::kAllReduce, 0, 4096, 0, 0, 10000, {}}); });
      st[0] = comms[0]->Run({wc::CollectiveOp::kAllReduce, 0, 4096, 0, 0, 10000, {}});
      other.join();
      if (!st[0].ok() || !st[1].ok()) {
        ADD_FAILURE() << st[0] << " / " << st[1];
        return;
      }
      for (int r = 0; r < 2; ++r) {
        for (int i = 0; i < 4096; ++i) wrong += comms[r]->data()[i] != static_cast<float>(3 * i + 2 * rounds);
      }
      ++rounds;
    }
  });
  const std::vector<double> beside = Losses(**engine);
  training = false;
  reducer.join();
  EXPECT_EQ(beside, alone);
  EXPECT_GE(rounds.load(), 20);
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace rp::scheduler
