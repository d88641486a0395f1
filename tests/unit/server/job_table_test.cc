// The job manager's index on its own: ids and seqs, ListJobs pages in submission order (also when
// admissions finish out of order), state filters, bounds on page sizes and tokens, counts.
#include "server/job_table.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace rp::server {
namespace {

namespace v1 = roundpipe::v1;

std::shared_ptr<ManagedJob> MakeJob(int64_t seq, v1::JobState state) {
  auto job = std::make_shared<ManagedJob>();
  job->seq = seq;
  job->id = JobTable::IdOf(seq);
  absl::MutexLock lock(&job->mu);
  job->record.set_id(job->id);
  job->record.set_state(state);
  return job;
}

std::vector<std::string> Ids(const v1::ListJobsResponse& r) {
  std::vector<std::string> out;
  for (const v1::Job& j : r.jobs()) out.push_back(j.id());
  return out;
}

TEST(JobTable, IdsAndSeqsRoundTripAndOnlyJobIdsParse) {
  EXPECT_EQ(JobTable::IdOf(42), "job-000042");
  EXPECT_EQ(JobTable::IdOf(1234567), "job-1234567");
  EXPECT_EQ(JobTable::SeqOf("job-000042"), 42);
  EXPECT_EQ(JobTable::SeqOf(JobTable::IdOf(1234567)), 1234567);
  for (const char* bad : {"job-", "job-abc", "jobs-1", "job--3", "job-0", "export-journal", "", "job-12x"}) {
    EXPECT_EQ(JobTable::SeqOf(bad), 0) << bad;
  }
}

TEST(JobTable, SeqsAreNeverHandedOutTwiceAndOnlyMoveForward) {
  JobTable table;
  std::vector<std::vector<int64_t>> got(4);
  std::vector<std::thread> threads;
  for (auto& mine : got) {
    threads.emplace_back([&table, &mine] {
      for (int i = 0; i < 500; ++i) mine.push_back(table.ReserveSeq());
    });
  }
  for (auto& t : threads) t.join();
  std::set<int64_t> all;
  for (const auto& mine : got) all.insert(mine.begin(), mine.end());
  EXPECT_EQ(all.size(), 2000u);
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(table.next_seq(), 2001);
  table.ContinueAfter(10);  // behind: no effect
  EXPECT_EQ(table.next_seq(), 2001);
  table.ContinueAfter(5000);
  EXPECT_EQ(table.ReserveSeq(), 5001);
  // Adding a job with a higher seq (from the store) moves them on too.
  ASSERT_TRUE(table.Add(MakeJob(9000, v1::JOB_STATE_QUEUED)).ok());
  EXPECT_EQ(table.ReserveSeq(), 9001);
}

TEST(JobTable, AJobIsListedOnce) {
  JobTable table;
  ASSERT_TRUE(table.Add(MakeJob(3, v1::JOB_STATE_QUEUED)).ok());
  EXPECT_EQ(table.Add(MakeJob(3, v1::JOB_STATE_QUEUED)).code(), absl::StatusCode::kAlreadyExists);
  auto same_id = MakeJob(4, v1::JOB_STATE_QUEUED);
  same_id->id = JobTable::IdOf(3);
  EXPECT_EQ(table.Add(same_id).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table.All().size(), 1u);
  EXPECT_NE(table.Find("job-000003"), nullptr);
  EXPECT_EQ(table.Find("job-000004"), nullptr);
}

// Two submissions admitted out of order (seq 2 listed before seq 1): a client paging one job at
// a time still sees both, in submission order.
TEST(JobTable, PagesFollowSubmissionOrderEvenWhenAdmissionsFinishOutOfOrder) {
  JobTable table;
  for (int64_t seq : {2, 1, 5, 3, 4}) ASSERT_TRUE(table.Add(MakeJob(seq, v1::JOB_STATE_RUNNING)).ok());
  std::vector<std::string> seen;
  v1::ListJobsRequest req;
  req.set_page_size(1);
  for (int pages = 0; pages < 10; ++pages) {
    auto page = table.Page(req);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const std::string& id : Ids(*page)) seen.push_back(id);
    if (page->next_page_token().empty()) break;
    req.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"job-000001", "job-000002", "job-000003", "job-000004", "job-000005"}));
}

TEST(JobTable, PagesFilterByStateAndBoundTheirSize) {
  JobTable table;
  for (int64_t seq = 1; seq <= 1205; ++seq) {
    ASSERT_TRUE(table.Add(MakeJob(seq, seq % 3 == 0 ? v1::JOB_STATE_FAILED : v1::JOB_STATE_SUCCEEDED)).ok());
  }
  v1::ListJobsRequest req;
  auto page = table.Page(req);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->jobs_size(), 100);  // the default
  EXPECT_EQ(page->next_page_token(), "100");
  req.set_page_size(100000);
  page = table.Page(req);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->jobs_size(), 1000);  // the bound
  req.add_states(v1::JOB_STATE_FAILED);
  req.set_page_size(0);
  req.set_page_token("1190");
  page = table.Page(req);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(Ids(*page),
            (std::vector<std::string>{"job-001191", "job-001194", "job-001197", "job-001200", "job-001203"}));
  EXPECT_TRUE(page->next_page_token().empty());
  req.set_page_size(-1);
  EXPECT_EQ(table.Page(req).status().code(), absl::StatusCode::kInvalidArgument);
  req.set_page_size(1);
  for (const char* bad : {"abc", "-5", "1e3", "99999999999999999999999"}) {
    req.set_page_token(bad);
    EXPECT_EQ(table.Page(req).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(JobTable, CountsJobsPerStateAndThoseNotEnded) {
  JobTable table;
  int64_t seq = 0;
  for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_PAUSED,
                         v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    ASSERT_TRUE(table.Add(MakeJob(++seq, s)).ok());
  }
  const auto counts = table.CountByState();
  EXPECT_EQ(counts.at(v1::JOB_STATE_RUNNING), 2);
  EXPECT_EQ(counts.at(v1::JOB_STATE_CANCELLED), 1);
  EXPECT_EQ(counts.count(v1::JOB_STATE_UNSPECIFIED), 0u);
  EXPECT_EQ(table.CountNotEnded(), 4);
  {
    auto job = table.Find("job-000002");
    absl::MutexLock lock(&job->mu);
    job->record.set_state(v1::JOB_STATE_SUCCEEDED);
  }
  EXPECT_EQ(table.CountNotEnded(), 3);
}

}  // namespace
}  // namespace rp::server
