#include "workers/spec/fair_share.h"

#include <algorithm>
#include <utility>

#include "workers/base/check.h"

namespace rp::spec {

int FairShare::AddLane(double weight) {
  RP_CHECK(weight > 0) << "a lane's weight must be positive";
  const int id = next_id_++;
  lanes_[id] = Lane{weight, vclock_, 0, false};
  return id;
}

void FairShare::RemoveLane(int lane) { RP_CHECK(lanes_.erase(lane) == 1) << "unknown lane " << lane; }

const FairShare::Lane& FairShare::Get(int lane) const {
  auto it = lanes_.find(lane);
  RP_CHECK(it != lanes_.end()) << "unknown lane " << lane;
  return it->second;
}

FairShare::Lane& FairShare::Get(int lane) { return const_cast<Lane&>(std::as_const(*this).Get(lane)); }

void FairShare::Wait(int lane) {
  Lane& l = Get(lane);
  RP_CHECK(!l.waiting) << "lane " << lane << " already waits";
  l.waiting = true;
  l.vtime = std::max(l.vtime, vclock_);  // no credit banked while idle
}

std::optional<int> FairShare::Next() {
  std::optional<int> best;
  double best_vtime = 0;
  for (const auto& [id, l] : lanes_) {
    if (!l.waiting) continue;
    if (!best || l.vtime < best_vtime) {
      best = id;
      best_vtime = l.vtime;
    }
  }
  if (best) {
    Lane& l = lanes_[*best];
    l.waiting = false;
    vclock_ = std::max(vclock_, l.vtime);
  }
  return best;
}

void FairShare::Charge(int lane, double seconds) {
  Lane& l = Get(lane);
  l.vtime += std::max(0.0, seconds) / l.weight;
  l.used_s += std::max(0.0, seconds);
}

double FairShare::used_seconds(int lane) const { return Get(lane).used_s; }

bool FairShare::WouldLead(int lane) const {
  const double mine = std::max(Get(lane).vtime, vclock_);
  bool others = false;
  for (const auto& [id, l] : lanes_) {
    if (id == lane || !l.waiting) continue;
    others = true;
    if (l.vtime <= mine) return false;
  }
  return others;
}

bool FairShare::waiting(int lane) const { return Get(lane).waiting; }

double FairShare::virtual_time(int lane) const { return Get(lane).vtime; }

}  // namespace rp::spec
