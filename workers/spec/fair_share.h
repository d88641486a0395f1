// fair_share.h — who computes next on a device several jobs share: weighted fair queueing by
// the time each job has used (start-time fair queueing). A job's virtual time grows by the
// seconds it computed divided by its weight; among the jobs waiting, the one with the least
// virtual time goes next (ties: the lane added first). A job that was idle joins at the virtual
// time of the work in service, so it gets its share from then on, not a burst for the time it
// was away. Over any stretch where the jobs keep waiting, each gets compute time in proportion
// to its weight (to within one operation).
//
// It lives with the shared value types because two rooms follow it: a device's ComputeGate
// (workers/device/compute_gate.h) orders real operations by it, and the planner's pool simulator
// (scheduler/planning/pool_simulator.h) orders simulated ones by the same code.
//
// Contract: plain data, not thread-safe (ComputeGate holds it under its lock). Lanes are ids
// handed out by AddLane; calls with other ids are invariant violations (RP_CHECK).
#pragma once

#include <map>
#include <optional>

namespace rp::spec {

class FairShare {
 public:
  // `weight` > 0: a job's share (JobSpec::share).
  int AddLane(double weight);
  void RemoveLane(int lane);
  // The lane has an operation ready to compute.
  void Wait(int lane);
  // The waiting lane that goes next, taken off the waiting set (nullopt: none waits).
  std::optional<int> Next();
  // The lane's operation computed for `seconds`.
  void Charge(int lane, double seconds);

  // The lane would go next if it were waiting now (its virtual time below every waiting lane's),
  // and some other lane waits.
  bool WouldLead(int lane) const;
  bool waiting(int lane) const;
  double virtual_time(int lane) const;
  double used_seconds(int lane) const;  // compute time charged to the lane so far
  int lanes() const { return static_cast<int>(lanes_.size()); }

 private:
  struct Lane {
    double weight = 1;
    double vtime = 0;
    double used_s = 0;
    bool waiting = false;
  };
  const Lane& Get(int lane) const;
  Lane& Get(int lane);
  std::map<int, Lane> lanes_;
  double vclock_ = 0;  // the virtual start time of the latest operation granted
  int next_id_ = 0;
};

}  // namespace rp::spec
