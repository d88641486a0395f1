#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "workers/device/cpu_device.h"
#include "workers/store/activation_store.h"

namespace rp::workers {
namespace {

TEST(CpuStream, RunsInOrderAndEventsOrderStreams) {
  Timeline tl;
  auto devs = CreateDevices("cpu:2", &tl);
  ASSERT_TRUE(devs.ok()) << devs.status();
  Device& d0 = *(*devs)[0];
  Device& d1 = *(*devs)[1];
  std::vector<int> order;
  std::mutex mu;
  auto push = [&](int v) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(v);
  };
  auto e = MakeEvent();
  // d1's compute waits for an event recorded after two ops on d0's copy stream.
  d1.stream(StreamKind::kCompute).WaitEvent(e);
  d1.stream(StreamKind::kCompute).Enqueue({"after", 0, 0, 0}, [&] { push(3); });
  d0.stream(StreamKind::kActivationUp).Enqueue({"first", 0, 0, 0}, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    push(1);
  });
  d0.stream(StreamKind::kActivationUp).Enqueue({}, [&] { push(2); });
  d0.stream(StreamKind::kActivationUp).RecordEvent(e);
  d1.SynchronizeAll();
  d0.SynchronizeAll();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  auto entries = tl.Entries();
  ASSERT_EQ(entries.size(), 2u);  // unlabeled ops are not recorded
  EXPECT_EQ(entries[0].stream, "act-up");
  EXPECT_EQ(entries[1].stream, "compute");
  EXPECT_EQ(entries[1].worker, 1);
  EXPECT_GE(entries[1].start_s, entries[0].end_s);
  EXPECT_NE(tl.ChromeTrace().find("\"traceEvents\""), std::string::npos);
}

// A copy operation is busy from its first transfer on: time it spends waiting on the host (an
// input upload blocked until another worker produced the activation) is not transfer time. A
// compute operation is busy from its start.
TEST(CpuStream, CopyOperationsAreBusyFromTheirFirstTransferOn) {
  Timeline tl;
  auto devs = CreateDevices("cpu:1", &tl);
  ASSERT_TRUE(devs.ok()) << devs.status();
  Device& d = *(*devs)[0];
  const auto wait = std::chrono::milliseconds(200);
  d.stream(StreamKind::kActivationUp).Enqueue({"in", 0, 0, 0}, [&] {
    std::this_thread::sleep_for(wait);  // stands for ActivationStore::Take blocking
    (void)d.Upload(at::ones({4}));
  });
  d.stream(StreamKind::kCompute).Enqueue({"work", 0, 0, 0}, [&] { std::this_thread::sleep_for(wait); });
  d.SynchronizeAll();
  std::map<std::string, double> dur;
  for (const auto& e : tl.Entries()) dur[e.label] = e.end_s - e.start_s;
  ASSERT_EQ(dur.size(), 2u);
  EXPECT_LT(dur["in"], 0.15) << "the host wait was counted as transfer time";
  EXPECT_GE(dur["work"], 0.19);
}

TEST(Timeline, IsBoundedAndScansOnlyTheRecentTail) {
  Timeline tl(/*max_entries=*/100);
  for (int i = 0; i < 250; ++i) tl.Add({0, "compute", "op", 0, i, 0, i * 1.0, i + 0.5});
  auto all = tl.Entries();
  ASSERT_EQ(all.size(), 100u);  // the oldest 150 were dropped
  EXPECT_EQ(all.front().slot, 150);
  auto recent = tl.EntriesEndingSince(240.0);
  ASSERT_EQ(recent.size(), 10u);  // ends 240.5 .. 249.5
  EXPECT_EQ(recent.front().slot, 240);
  EXPECT_TRUE(tl.EntriesEndingSince(1e9).empty());
}

TEST(CpuStream, AnEscapedExceptionDoesNotKillTheStream) {
  auto devs = *CreateDevices("cpu:1", nullptr);
  Stream& s = devs[0]->stream(StreamKind::kCompute);
  std::atomic<int> ran{0};
  s.Enqueue({}, [] { throw std::runtime_error("boom"); });
  s.Enqueue({}, [&] { ++ran; });
  s.Synchronize();
  EXPECT_EQ(ran.load(), 1);
}

TEST(ActivationStore, CountsConsumersAndTracksPeak) {
  ActivationStore a;
  a.Put(ActKind::kActivation, 3, 0, at::zeros({10}, at::kFloat), 2);  // 40 bytes
  a.Put(ActKind::kGradient, 3, 0, at::zeros({5}, at::kFloat), 1);     // 20 bytes
  EXPECT_EQ(a.live_bytes(), 60);
  EXPECT_TRUE(a.Take(ActKind::kActivation, 3, 0).ok());
  EXPECT_EQ(a.live_bytes(), 60);  // one consumer left
  EXPECT_TRUE(a.Take(ActKind::kActivation, 3, 0).ok());
  EXPECT_EQ(a.live_bytes(), 20);
  EXPECT_TRUE(a.Take(ActKind::kGradient, 3, 0).ok());
  EXPECT_EQ(a.live_bytes(), 0);
  EXPECT_EQ(a.peak_bytes(), 60);
  EXPECT_EQ(a.live_slots(), 0u);
}

TEST(ActivationStore, TakeWaitsForPutAndAbortWakesWaiters) {
  ActivationStore a;
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    a.Put(ActKind::kActivation, 1, 4, at::ones({2}), 1);
  });
  auto t = a.Take(ActKind::kActivation, 1, 4);
  producer.join();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->sum().item<float>(), 2.0f);

  std::thread waiter([&] {
    auto r = a.Take(ActKind::kGradient, 9, 9);
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("stage failed"), std::string::npos);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  a.Abort(absl::InternalError("stage failed"));
  waiter.join();
  a.Reset();
  a.Put(ActKind::kLabels, 0, 0, at::ones({1}), 1);
  EXPECT_TRUE(a.Take(ActKind::kLabels, 0, 0).ok());  // usable again after Reset
}

}  // namespace
}  // namespace rp::workers
