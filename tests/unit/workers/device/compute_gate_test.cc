// Sharing one device's compute among jobs: the fair-share order on its own (shares split the
// compute time, an idle job gets no burst, ties go to the older lane), the gate under threads
// (one operation at a time, every operation runs, an exception frees the device) and a lane
// device (its own streams, compute through the gate, everything else the device's).
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <stdexcept>
#include <thread>
#include <vector>

#include "workers/device/compute_gate.h"
#include "workers/device/cpu_device.h"
#include "workers/device/lane_device.h"
#include "workers/spec/fair_share.h"

namespace rp::workers {
namespace {

using spec::FairShare;

// Every lane keeps an operation waiting; each operation costs `cost[lane]`. Returns the compute
// time each lane was given over `grants` turns.
std::vector<double> Contend(FairShare& f, const std::vector<int>& lanes, const std::vector<double>& cost, int grants) {
  std::vector<double> got(lanes.size(), 0);
  for (int l : lanes) f.Wait(l);
  for (int g = 0; g < grants; ++g) {
    const auto next = f.Next();
    EXPECT_TRUE(next.has_value());
    const size_t i = static_cast<size_t>(std::find(lanes.begin(), lanes.end(), *next) - lanes.begin());
    f.Charge(*next, cost[i]);
    got[i] += cost[i];
    f.Wait(*next);
  }
  return got;
}

TEST(FairShare, ComputeTimeIsSplitByTheShares) {
  FairShare f;
  const int a = f.AddLane(3), b = f.AddLane(1);
  auto got = Contend(f, {a, b}, {1.0, 1.0}, 400);
  EXPECT_NEAR(got[0] / (got[0] + got[1]), 0.75, 0.005);
  // Unequal operation times: shares still split the time, not the number of operations.
  FairShare g;
  const int x = g.AddLane(1), y = g.AddLane(1), z = g.AddLane(2);
  got = Contend(g, {x, y, z}, {0.5, 2.0, 1.0}, 3000);
  const double total = got[0] + got[1] + got[2];
  EXPECT_NEAR(got[0] / total, 0.25, 0.01);
  EXPECT_NEAR(got[1] / total, 0.25, 0.01);
  EXPECT_NEAR(got[2] / total, 0.50, 0.01);
}

TEST(FairShare, AnIdleJobGetsItsShareFromWhenItReturnsNotABurst) {
  FairShare f;
  const int a = f.AddLane(1), b = f.AddLane(1);
  // a computes alone for 100 s (b idle).
  for (int i = 0; i < 100; ++i) {
    f.Wait(a);
    ASSERT_EQ(f.Next(), a);
    f.Charge(a, 1.0);
  }
  // b returns: they alternate from here; b is never granted 100 s in a row.
  f.Wait(a);
  f.Wait(b);
  int run_of_b = 0, longest = 0;
  for (int g = 0; g < 40; ++g) {
    const int n = *f.Next();
    f.Charge(n, 1.0);
    run_of_b = n == b ? run_of_b + 1 : 0;
    longest = std::max(longest, run_of_b);
    f.Wait(n);
  }
  EXPECT_LE(longest, 2);
}

TEST(FairShare, TiesGoToTheOlderLaneAndNoneWaitingGrantsNothing) {
  FairShare f;
  const int a = f.AddLane(1), b = f.AddLane(1);
  EXPECT_FALSE(f.Next().has_value());
  f.Wait(b);
  f.Wait(a);
  EXPECT_EQ(f.Next(), a);
  EXPECT_EQ(f.Next(), b);
  EXPECT_FALSE(f.Next().has_value());
  f.RemoveLane(a);
  EXPECT_EQ(f.lanes(), 1);
}

TEST(ComputeGate, OneOperationAtATimeAndEveryOneRuns) {
  ComputeGate gate;
  std::vector<int> lanes = {gate.AddLane(1), gate.AddLane(3), gate.AddLane(0.5)};
  std::atomic<int> inside{0}, most{0}, ran{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {  // one thread per lane, as a lane's compute stream is
    threads.emplace_back([&, lane = lanes[static_cast<size_t>(t)]] {
      for (int i = 0; i < 400; ++i) {
        gate.Run(lane, [&] {
          const int now = ++inside;
          int m = most.load();
          while (now > m && !most.compare_exchange_weak(m, now)) {
          }
          std::this_thread::yield();
          --inside;
          ++ran;
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ran.load(), 1200);
  EXPECT_EQ(most.load(), 1);
  for (int l : lanes) EXPECT_GT(gate.virtual_time(l), 0);
}

// Two lanes that always have their next operation ready, shares 3 and 1: the device's time
// splits 3:1. A lane hands the gate one operation at a time, so without holding the device a
// moment for a lane still owed compute (the anticipation), they would alternate 1:1.
TEST(ComputeGate, BackloggedLanesSplitTheDeviceByTheirShares) {
  ComputeGate gate;
  const int a = gate.AddLane(3), b = gate.AddLane(1);
  std::atomic<bool> stop{false};
  auto loop = [&](int lane) {
    while (!stop.load()) {
      gate.Run(
          lane, [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }, [] { return true; });
    }
  };
  std::thread ta(loop, a), tb(loop, b);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  stop = true;
  ta.join();
  tb.join();
  const double used_a = gate.used_seconds(a), used_b = gate.used_seconds(b);
  EXPECT_NEAR(used_a / (used_a + used_b), 0.75, 0.05) << used_a << " s vs " << used_b << " s";
}

TEST(ComputeGate, AThrowingOperationFreesTheDevice) {
  ComputeGate gate;
  const int a = gate.AddLane(1), b = gate.AddLane(1);
  EXPECT_THROW(gate.Run(a, [] { throw std::runtime_error("boom"); }), std::runtime_error);
  bool ran = false;
  std::thread other([&] { gate.Run(b, [&] { ran = true; }); });
  other.join();
  EXPECT_TRUE(ran);
}

TEST(LaneDevice, ALaneHasItsOwnStreamsAndComputesThroughTheGate) {
  Timeline timeline;
  CpuDevice dev(0, &timeline);
  ComputeGate gate;
  auto lane = std::make_unique<LaneDevice>(&dev, &gate, 2.0, /*job=*/7);
  EXPECT_EQ(lane->index(), 0);
  EXPECT_EQ(lane->name(), dev.name());
  for (int k = 0; k < kNumStreamKinds; ++k) {
    EXPECT_NE(&lane->stream(static_cast<StreamKind>(k)), &dev.stream(static_cast<StreamKind>(k)));
  }
  // A lane's stream blocked on a wait never holds the device's own streams (or another lane's).
  auto other = std::make_unique<LaneDevice>(&dev, &gate, 1.0, /*job=*/8);
  EventPtr never = MakeEvent();
  lane->stream(StreamKind::kCompute).WaitEvent(never);
  std::atomic<bool> other_ran{false};
  other->stream(StreamKind::kCompute).Enqueue({}, [&] { other_ran = true; });
  other->stream(StreamKind::kCompute).Synchronize();
  EXPECT_TRUE(other_ran.load());
  // Compute charges the lane at the gate; copies count on the device.
  std::atomic<bool> computed{false};
  const int64_t before = dev.TransferBytes(StreamKind::kParamUp);
  other->stream(StreamKind::kParamUp).Enqueue({}, [&] { (void)other->Upload(at::ones({4})); });
  other->stream(StreamKind::kCompute).Enqueue({"F mb0", 3, 1, 0}, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    computed = true;
  });
  other->SynchronizeAll();
  EXPECT_TRUE(computed.load());
  // The timeline tells whose operation it was (each job's statistics read only its own).
  dev.stream(StreamKind::kCompute).Enqueue({"device's own", 3, 1, 0}, [] {});
  dev.stream(StreamKind::kCompute).Synchronize();
  std::map<std::string, int> job_of;
  for (const TimelineEntry& e : timeline.Entries()) job_of[e.label] = e.job;
  EXPECT_EQ(job_of.at("F mb0"), 8);
  EXPECT_EQ(job_of.at("device's own"), -1);
  EXPECT_NE(timeline.ChromeTrace().find("compute job 8"), std::string::npos);
  EXPECT_EQ(dev.TransferBytes(StreamKind::kParamUp) - before, 16);
  EXPECT_GT(gate.virtual_time(other->lane()), 0);
  never->Set();
  lane.reset();  // drains its streams, then leaves the gate
  other.reset();
}

}  // namespace
}  // namespace rp::workers
