// background_tasks.h — request work that touches files or waits (submit, export, checkpoint,
// drain) run on threads of its own, off the gRPC callback threads, so no client can hold those.
// A bounded set: at most `max_tasks` run at once; beyond that Run refuses with
// ResourceExhausted and the caller answers its RPC with it. An exception inside a task is
// logged and contained (status_util.h Guarded), never the daemon's end.
//
// Contract: Run and JoinAll are thread-safe. Finished threads are joined when the next task
// starts; JoinAll joins every thread (the owner calls it before anything a task uses goes away)
// and refuses new tasks from then on (Unavailable).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace rp::server {

class BackgroundTasks {
 public:
  explicit BackgroundTasks(int max_tasks) : max_tasks_(max_tasks) {}
  ~BackgroundTasks() { JoinAll(); }
  BackgroundTasks(const BackgroundTasks&) = delete;
  BackgroundTasks& operator=(const BackgroundTasks&) = delete;

  absl::Status Run(std::function<void()> task);
  void JoinAll();
  int running() const;  // tasks started and not yet finished

 private:
  struct Task {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  const int max_tasks_;
  mutable absl::Mutex mu_;
  std::vector<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace rp::server
