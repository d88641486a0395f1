// The job manager's parts, each on its own: the bounded background-task runner, the export
// journal that makes a killed export leave nothing behind, the per-state job gauge and a job's
// watchers.
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "absl/synchronization/notification.h"
#include "server/background_tasks.h"
#include "server/export_journal.h"
#include "server/job_gauges.h"
#include "server/job_watchers.h"

namespace rp::server {
namespace {

namespace fs = std::filesystem;
namespace v1 = roundpipe::v1;

TEST(BackgroundTasks, RunsAtMostItsBoundAndReapsFinishedOnes) {
  BackgroundTasks tasks(3);
  absl::Notification release;
  std::atomic<int> ran{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(tasks
                    .Run([&] {
                      release.WaitForNotification();
                      ++ran;
                    })
                    .ok());
  }
  const absl::Status full = tasks.Run([] {});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("3 requests"), std::string::npos) << full;
  EXPECT_EQ(tasks.running(), 3);
  release.Notify();
  while (tasks.running() > 0) std::this_thread::yield();
  EXPECT_EQ(ran.load(), 3);
  // The finished threads are joined when the next task starts: room for three again.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(tasks.Run([&] { ++ran; }).ok());
  tasks.JoinAll();
  EXPECT_EQ(ran.load(), 6);
}

TEST(BackgroundTasks, AThrowingTaskIsContainedAndJoinAllClosesTheRunner) {
  BackgroundTasks tasks(2);
  ASSERT_TRUE(tasks.Run([] { throw std::runtime_error("boom"); }).ok());
  std::atomic<bool> after{false};
  ASSERT_TRUE(tasks.Run([&] { after = true; }).ok());
  tasks.JoinAll();  // waits for both; the exception did not end the process
  EXPECT_TRUE(after.load());
  EXPECT_EQ(tasks.Run([] {}).code(), absl::StatusCode::kUnavailable);
}

TEST(ExportJournal, ATornExportIsRemovedAtTheNextStartAndAFinishedOneLeavesNoEntry) {
  const fs::path root = fs::path(::testing::TempDir()) / "export_journal_test";
  fs::remove_all(root);
  fs::create_directories(root / "jobs");
  fs::create_directories(root / "out");
  ExportJournal journal((root / "jobs").string());

  // A finished export: Begin names the target, End removes the entry.
  const std::string done = journal.Begin("7", (root / "out" / "export-step4").string());
  std::string named;
  std::getline(std::ifstream(done), named);
  EXPECT_EQ(named, (root / "out" / "export-step4").string());
  journal.End(done);
  EXPECT_FALSE(fs::exists(done));

  // A killed one: its entry and the temporary it was writing stay behind (kill -9).
  const fs::path target = root / "out" / "export-step9";
  const std::string torn = journal.Begin("7", target.string());
  fs::create_directories(root / "out" / ".export-step9.tmp-0123456789abcdef" / "part");
  const fs::path unrelated = root / "out" / ".other.tmp-0123456789abcdef";
  fs::create_directories(unrelated);
  EXPECT_NE(journal.Begin("8", (root / "out" / "x").string()), torn);  // another target, another entry

  ExportJournal restarted((root / "jobs").string());
  EXPECT_EQ(restarted.RemoveTorn(), 1);
  EXPECT_FALSE(fs::exists(root / "out" / ".export-step9.tmp-0123456789abcdef"));
  EXPECT_TRUE(fs::exists(unrelated));  // not journaled: not ours to remove
  EXPECT_FALSE(fs::exists(torn));
  for (const auto& e : fs::directory_iterator(root / "jobs")) ADD_FAILURE() << "entry left: " << e.path();
  fs::remove_all(root);
}

double Value(prometheus::Family<prometheus::Gauge>& family, const char* state) {
  return family.Add({{"state", state}}).Value();
}

TEST(JobGauges, AbsoluteCountsThenMovesPerTransition) {
  prometheus::Registry registry;
  auto& family = prometheus::BuildGauge().Name("roundpipe_jobs").Help("jobs by state").Register(registry);
  JobGauges gauges(&family);
  gauges.SetCounts({{v1::JOB_STATE_PAUSED, 2}, {v1::JOB_STATE_SUCCEEDED, 5}});
  EXPECT_EQ(Value(family, "paused"), 2);
  EXPECT_EQ(Value(family, "succeeded"), 5);
  EXPECT_EQ(Value(family, "queued"), 0);
  gauges.Move(v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_QUEUED);  // a new job
  gauges.Move(v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING);
  gauges.Move(v1::JOB_STATE_RUNNING, v1::JOB_STATE_RUNNING);  // no move
  gauges.Move(v1::JOB_STATE_PAUSED, v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Value(family, "queued"), 0);
  EXPECT_EQ(Value(family, "running"), 1);
  EXPECT_EQ(Value(family, "paused"), 1);
  EXPECT_EQ(Value(family, "cancelled"), 1);
  EXPECT_EQ(JobGauges::Label(v1::JOB_STATE_SUCCEEDED), "succeeded");
}

// A subscriber that records what it heard and goes away after `stay` events.
class Recorder : public JobSubscriber {
 public:
  explicit Recorder(int stay) : stay_(stay) {}
  bool OnEvent(const v1::JobEvent& event, bool last) override {
    heard.push_back(event.message() + (last ? " (last)" : ""));
    return static_cast<int>(heard.size()) < stay_;
  }
  std::vector<std::string> heard;

 private:
  int stay_;
};

v1::JobEvent Event(const std::string& message) {
  v1::JobEvent e;
  e.set_message(message);
  return e;
}

TEST(JobWatchers, EachHearsTheStateThenEveryEventUntilItLeavesOrTheJobEnds) {
  JobWatchers w;
  auto stays = std::make_shared<Recorder>(100);
  auto leaves = std::make_shared<Recorder>(2);  // gone after its second event
  auto removed = std::make_shared<Recorder>(100);
  w.Add(stays, Event("queued"), false);
  w.Add(leaves, Event("queued"), false);
  w.Add(removed, Event("queued"), false);
  auto late = std::make_shared<Recorder>(100);
  EXPECT_EQ(w.size(), 3u);
  w.Publish(Event("step 1"), false);
  EXPECT_EQ(w.size(), 2u);  // `leaves` declined
  w.Remove(removed.get());
  w.Publish(Event("step 2"), false);
  w.Publish(Event("succeeded"), true);
  EXPECT_EQ(w.size(), 0u);
  w.Add(late, Event("succeeded"), true);  // joins an ended job: hears the end, is not kept
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(stays->heard, (std::vector<std::string>{"queued", "step 1", "step 2", "succeeded (last)"}));
  EXPECT_EQ(leaves->heard, (std::vector<std::string>{"queued", "step 1"}));
  EXPECT_EQ(removed->heard, (std::vector<std::string>{"queued", "step 1"}));
  EXPECT_EQ(late->heard, (std::vector<std::string>{"succeeded (last)"}));
}

TEST(JobWatchers, ADaemonGoingAwayEndsEveryStream) {
  JobWatchers w;
  auto a = std::make_shared<Recorder>(100), b = std::make_shared<Recorder>(100);
  w.Add(a, Event("running"), false);
  w.Add(b, Event("running"), false);
  w.CloseAll("7", "daemon shutting down");
  EXPECT_EQ(w.size(), 0u);
  EXPECT_EQ(a->heard.back(), "daemon shutting down (last)");
  EXPECT_EQ(b->heard.back(), "daemon shutting down (last)");
}

}  // namespace
}  // namespace rp::server
