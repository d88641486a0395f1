#include "workers/device/pacer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"

namespace rp::workers {
namespace {

bool Finite(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<Pacer>> Pacer::Create(PacerOptions o) {
  if (o.layers.empty()) return absl::InvalidArgumentError("paced devices: the profile has no layers");
  for (size_t l = 0; l < o.layers.size(); ++l) {
    const PacedLayerTimes& t = o.layers[l];
    if (!Finite(t.forward_s) || !Finite(t.backward_s) || !Finite(t.fused_s)) {
      return absl::InvalidArgumentError(absl::StrCat("paced devices: layer ", l, " has a negative or non-finite time"));
    }
  }
  if (!(o.time_scale > 0 && o.time_scale <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("paced devices: time_scale ", o.time_scale, " is not in (0, 1]"));
  }
  if (!(o.link_bytes_per_s > 0) || !std::isfinite(o.link_bytes_per_s)) {
    return absl::InvalidArgumentError("paced devices: link_bytes_per_s must be positive");
  }
  if (!Finite(o.host_bytes_per_s) || !Finite(o.optimizer_bytes_per_s)) {
    return absl::InvalidArgumentError("paced devices: host_bytes_per_s and optimizer_bytes_per_s must be >= 0");
  }
  return std::unique_ptr<Pacer>(new Pacer(std::move(o)));
}

double Pacer::ComputeSeconds(PacedCompute kind, int first_layer, int num_layers) const {
  double s = 0;
  const int end = std::min(first_layer + num_layers, this->num_layers());
  for (int l = std::max(0, first_layer); l < end; ++l) {
    const PacedLayerTimes& t = options_.layers[static_cast<size_t>(l)];
    switch (kind) {
      case PacedCompute::kForward:
      case PacedCompute::kRecompute:
        s += t.forward_s;
        break;
      case PacedCompute::kFused:
        s += t.fused_s;
        break;
      case PacedCompute::kBackward:
        s += t.backward_s;
        break;
      case PacedCompute::kBackwardAfterRecompute:
        s += std::max(0.0, t.backward_s - t.forward_s);
        break;
    }
  }
  return s;
}

double Pacer::CopySeconds(int64_t bytes, int concurrent) const {
  double bw = options_.link_bytes_per_s;
  if (options_.host_bytes_per_s > 0) bw = std::min(bw, options_.host_bytes_per_s / std::max(1, concurrent));
  return static_cast<double>(std::max<int64_t>(bytes, 0)) / bw;
}

double Pacer::OptimizerSeconds(int64_t trainable_bytes) const {
  if (options_.optimizer_bytes_per_s <= 0) return 0;
  return static_cast<double>(trainable_bytes) / options_.optimizer_bytes_per_s;
}

namespace {
// Per stream thread: how far it runs behind its schedule, and when its last paced operation
// ended (an operation that starts later than kIdleGap after it found the stream idle: no debt).
thread_local double tl_debt_s = 0;
thread_local std::chrono::steady_clock::time_point tl_last_end{};
constexpr double kIdleGapS = 200e-6;
constexpr double kMaxDebtS = 2e-3;
}  // namespace

void Pacer::Spend(double real_seconds) const {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  if (std::chrono::duration<double>(start - tl_last_end).count() > kIdleGapS) tl_debt_s = 0;
  const double want = real_seconds * options_.time_scale;
  if (want > tl_debt_s) std::this_thread::sleep_until(start + std::chrono::duration<double>(want - tl_debt_s));
  tl_last_end = Clock::now();
  const double took = std::chrono::duration<double>(tl_last_end - start).count();
  // Bounded, so that one long preemption is not repaid by skipping many operations.
  tl_debt_s = std::clamp(tl_debt_s + took - want, 0.0, kMaxDebtS);
}

void Pacer::SpendCopy(int64_t bytes) const {
  const int n = copies_in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
  Spend(CopySeconds(bytes, n));
  copies_in_flight_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace rp::workers
