// job_watchers.h — who watches one job (WatchJob streams): each subscriber hears the job's
// current state when it joins, then every event, and `last` on the terminal one; a subscriber
// that has gone (its stream closed) is dropped at the next event.
//
// Contract: not thread-safe; its owner's lock guards it (JobManager: the job's mutex). A
// subscriber's OnEvent runs under that lock and must only enqueue.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "roundpipe/v1/jobs.pb.h"

namespace rp::server {

class JobSubscriber {
 public:
  virtual ~JobSubscriber() = default;
  // `last`: the job ended; no further events follow.
  // Returns false once the subscriber is gone (the watchers then drop it).
  virtual bool OnEvent(const roundpipe::v1::JobEvent& event, bool last) = 0;
};

class JobWatchers {
 public:
  // Sends `now` (the job's current state) to `subscriber`, then keeps it unless it declined or
  // `last` (the job has already ended).
  void Add(std::shared_ptr<JobSubscriber> subscriber, const roundpipe::v1::JobEvent& now, bool last);
  void Remove(const JobSubscriber* subscriber);
  // Every watcher hears `event`; the gone ones are dropped; after `last` none remain.
  void Publish(const roundpipe::v1::JobEvent& event, bool last);
  // The daemon goes away: each watcher hears a last event for `job_id` carrying `message` (its
  // stream ends UNAVAILABLE), then none remain.
  void CloseAll(const std::string& job_id, const std::string& message);
  size_t size() const { return subscribers_.size(); }

 private:
  std::vector<std::shared_ptr<JobSubscriber>> subscribers_;
};

}  // namespace rp::server
