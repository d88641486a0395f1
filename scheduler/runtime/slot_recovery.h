// slot_recovery.h — (runtime: behind the engine facade) one job's stage slots as runs that
// survive a lost worker. The controller submits every stage slot through it; it keeps each run
// until its iteration is awaited. When a device is lost (device_health.h) its streams drain at
// once; a thread of this class then takes every run on that device that had not finished,
// gives its inputs back (SlotAttempt::Abandon) and runs the slot again on a surviving device —
// in submission order, on a fresh lane of that device (five streams of its own), so a re-run
// never queues behind the survivor's own slots that wait for its outputs. What the first run
// already did is not done twice (SlotLedger), so the job's results are bit-identical to a run
// without the fault. The controller plans its next iterations over the usable workers only.
// A run that ran out of device memory (workers/device/out_of_memory.h) is re-run the same way —
// at once, since its device still works and may hold slots that wait for this one's outputs —
// and recorded for the controller, which re-plans with a tighter memory cap; a slot that runs
// out of memory kMaxOutOfMemoryRuns times fails its iteration.
//
// Contract: Submit, Usable, Poke and Forget are called by the controller's thread; the
// recovery thread is internal. The workers and their devices outlive this object; destroying it
// first waits for nothing (the controller waits for its slots before) and joins the thread.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "workers/base/mutex.h"
#include "workers/device/device.h"
#include "workers/device/lane_device.h"
#include "workers/device_worker.h"
#include "workers/run_context.h"
#include "workers/slot_attempt.h"
#include "workers/stage_task.h"

namespace rp::scheduler::runtime {

// A stage slot's run that ran out of device memory.
struct OutOfMemoryRun {
  workers::StageTask task;
  std::string what;  // where and the device's words
};

class SlotRecovery {
 public:
  static constexpr int kMaxOutOfMemoryRuns = 3;

  // `workers`: the job's workers (index = plan worker); `timeline_job`: the tag re-runs carry.
  SlotRecovery(std::vector<workers::DeviceWorker*> workers, int timeline_job);
  ~SlotRecovery();
  SlotRecovery(const SlotRecovery&) = delete;
  SlotRecovery& operator=(const SlotRecovery&) = delete;

  // Runs `task` on worker `worker`; the returned event is set once the slot finished (on that
  // worker or, should it be lost, on another).
  workers::EventPtr Submit(int worker, const workers::StageTask& task, std::shared_ptr<workers::RunContext> ctx);
  // The workers whose device works and is not drained, in index order.
  std::vector<int> Usable() const;
  // Looks again for runs on lost devices (after a dispatch that may have raced a loss).
  void Poke();
  // The runs of `iteration` are over (awaited): forget them. Returns how many of its slots were
  // run again.
  int Forget(int iteration);

  // The runs that ran out of device memory since the last call (controller's thread).
  std::vector<OutOfMemoryRun> TakeOutOfMemory();

  int64_t slots_rerun() const;
  int workers_lost() const;  // losses of the job's devices since it began (any thread)

 private:
  struct Run {
    int64_t seq = 0;  // submission order of the slot (a re-run keeps its slot's)
    workers::StageTask task;
    std::shared_ptr<workers::RunContext> ctx;
    std::shared_ptr<workers::SlotAttempt> attempt;
    workers::EventPtr drained;
    bool handled = false;
    int out_of_memory_runs = 0;  // earlier runs of the slot that ran out of device memory
  };
  // A survivor's fresh lane for one recovery pass, and what was run on it.
  struct Spare {
    std::unique_ptr<workers::LaneDevice> lane;
    std::unique_ptr<workers::DeviceWorker> worker;
    std::vector<workers::EventPtr> drained;
  };
  // Frees the lanes of earlier passes whose runs have all drained (a long job that keeps running
  // out of memory would otherwise keep five threads per survivor per pass).
  void DropIdlePasses();
  void Loop();
  // One pass: every unhandled run on a lost device, drained, abandoned and re-run elsewhere.
  void RecoverPass();
  // Runs the slot again on a survivor (or, with none left, fails its iteration and settles it).
  void Rerun(const Run& dead, std::vector<Spare>& spares, size_t& next_spare);

  const std::vector<workers::DeviceWorker*> workers_;
  const int timeline_job_;
  std::vector<int> listener_ids_;
  std::thread thread_;

  mutable base::Mutex mu_;
  base::CondVar cv_;
  std::deque<Run> runs_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool poked_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t slots_rerun_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int> rerun_by_iteration_ ABSL_GUARDED_BY(mu_);
  std::vector<OutOfMemoryRun> out_of_memory_ ABSL_GUARDED_BY(mu_);
  // Only the recovery thread touches these after construction.
  std::vector<std::vector<Spare>> passes_;
  std::vector<int64_t> losses_at_start_;  // each device's loss count when the job began
};

}  // namespace rp::scheduler::runtime
