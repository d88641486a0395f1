#include "server/background_tasks.h"

#include "absl/strings/str_cat.h"
#include "server/status_util.h"

namespace rp::server {

absl::Status BackgroundTasks::Run(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("the daemon is shutting down and starts no new request work");
  for (auto it = tasks_.begin(); it != tasks_.end();) {  // reap finished ones
    if (it->done->load()) {
      it->thread.join();
      it = tasks_.erase(it);
    } else {
      ++it;
    }
  }
  if (static_cast<int>(tasks_.size()) >= max_tasks_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        max_tasks_, " requests (submit/export/checkpoint/drain) are in progress; retry when one has finished"));
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  tasks_.push_back({std::thread([task = std::move(task), done] {
                      (void)Guarded("background task", [&] {
                        task();
                        return absl::OkStatus();
                      });
                      done->store(true);
                    }),
                    done});
  return absl::OkStatus();
}

void BackgroundTasks::JoinAll() {
  std::vector<Task> tasks;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t.thread.join();
}

int BackgroundTasks::running() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const Task& t : tasks_) n += !t.done->load();
  return n;
}

}  // namespace rp::server
