#include "server/job_watchers.h"

#include <algorithm>

namespace rp::server {

void JobWatchers::Add(std::shared_ptr<JobSubscriber> subscriber, const roundpipe::v1::JobEvent& now, bool last) {
  if (subscriber->OnEvent(now, last) && !last) subscribers_.push_back(std::move(subscriber));
}

void JobWatchers::Remove(const JobSubscriber* subscriber) {
  std::erase_if(subscribers_, [&](const auto& s) { return s.get() == subscriber; });
}

void JobWatchers::Publish(const roundpipe::v1::JobEvent& event, bool last) {
  std::erase_if(subscribers_, [&](const auto& s) { return !s->OnEvent(event, last); });
  if (last) subscribers_.clear();
}

void JobWatchers::CloseAll(const std::string& job_id, const std::string& message) {
  roundpipe::v1::JobEvent e;
  e.set_job_id(job_id);
  e.set_message(message);
  for (auto& s : subscribers_) s->OnEvent(e, true);
  subscribers_.clear();
}

}  // namespace rp::server
