#include "server/engine_metrics.h"

#include <algorithm>
#include <string>

namespace rp::server {

double EngineMetrics::seen_until() const {
  absl::MutexLock lock(&mu_);
  return timeline_seen_s_;
}

void EngineMetrics::RecordIteration(const scheduler::IterationStats& st, const scheduler::EngineStats& es,
                                    const std::vector<scheduler::OpRecord>& ops) {
  metrics_->iterations.Increment();
  metrics_->tokens_trained.Increment(static_cast<double>(st.tokens));
  metrics_->iteration_duration.Observe(st.seconds);
  if (st.optimizer_seconds > 0) metrics_->optimizer_step.Observe(st.optimizer_seconds);
  metrics_->loss.Set(st.loss);
  metrics_->learning_rate.Set(st.lr);
  metrics_->grad_norm.Set(st.grad_norm);
  metrics_->bubble_ratio.Set(st.bubble_ratio);
  if (st.collective_seconds > 0) metrics_->collective_seconds.Increment(st.collective_seconds);
  if (st.collective_bytes > 0) metrics_->collective_bytes.Increment(static_cast<double>(st.collective_bytes));
  absl::MutexLock lock(&mu_);
  double latest = timeline_seen_s_;
  for (const scheduler::OpRecord& e : ops) {
    if (e.end_s <= timeline_seen_s_) continue;
    metrics_->worker_busy.Add({{"worker", std::to_string(e.worker)}, {"stream", e.stream}})
        .Increment(e.end_s - e.start_s);
    latest = std::max(latest, e.end_s);
  }
  timeline_seen_s_ = latest;
  transfer_seen_.resize(es.devices.size());
  for (size_t d = 0; d < es.devices.size(); ++d) {
    const scheduler::DeviceStats& ds = es.devices[d];
    const struct {
      int64_t now;
      const char* direction;
      const char* what;
    } transfers[] = {{ds.activation_up_bytes, "host_to_device", "activation"},
                     {ds.activation_down_bytes, "device_to_host", "activation"},
                     {ds.param_up_bytes, "host_to_device", "parameter"},
                     {ds.grad_down_bytes, "device_to_host", "gradient"}};
    for (size_t k = 0; k < 4; ++k) {
      const int64_t delta = transfers[k].now - transfer_seen_[d][k];
      if (delta > 0) {
        metrics_->transfer_bytes.Add({{"direction", transfers[k].direction}, {"kind", transfers[k].what}})
            .Increment(static_cast<double>(delta));
      }
      transfer_seen_[d][k] = transfers[k].now;
    }
  }
  for (const scheduler::HostPool& p : scheduler::HostPools(es)) {
    metrics_->host_memory.Add({{"pool", p.name}}).Set(static_cast<double>(p.bytes));
  }
  for (const scheduler::DeviceStats& d : es.devices) {
    metrics_->device_memory.Add({{"device", d.name}}).Set(static_cast<double>(d.memory_in_use_bytes));
  }
  SetWorkerStates(metrics_, es);
}

void SetWorkerStates(DaemonMetrics* metrics, const scheduler::EngineStats& es) {
  const std::pair<scheduler::DeviceStats::State, const char*> states[] = {
      {scheduler::DeviceStats::State::kUp, "up"},
      {scheduler::DeviceStats::State::kDrained, "drained"},
      {scheduler::DeviceStats::State::kLost, "lost"}};
  for (const scheduler::DeviceStats& d : es.devices) {
    for (const auto& [state, name] : states) {
      metrics->worker_state.Add({{"device", d.name}, {"state", name}}).Set(d.state == state ? 1 : 0);
    }
  }
}

}  // namespace rp::server
