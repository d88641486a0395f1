// sim_schedule.h — a schedule as the simulator sees it: tasks with durations on resources
// (GPU workers, the CPU optimizer, per-worker parameter-upload links), a fixed execution order
// per resource, and dependency edges.
//
// Contract: plain data built by the schedule builders (schedules.h: RoundPipe and the
// weight-bound baselines; lost_worker_sim.h re-runs a lost worker's slots); read-only once built.
// Not thread-safe for concurrent mutation.
#pragma once

#include <string>
#include <vector>

namespace rp::planning {

enum class TaskPhase { kForward, kFused, kBackward, kOptimizer, kParamUpload, kGradDownload };

struct TaskDep {
  int task;
  double latency_s = 0;   // added after the dependency is satisfied (e.g. activation transfer)
  bool on_start = false;  // satisfied when `task` STARTS (e.g. its weights were uploaded)
  // Needed only by the task's tail (SimTask::head_fraction): a backward stage's upstream
  // gradient, which its recompute (the head) does not wait for.
  bool tail_only = false;
};

struct SimTask {
  int resource = 0;  // 0..N-1: GPU workers; see SimSchedule for the others
  double duration_s = 0;
  std::vector<TaskDep> deps;
  TaskPhase phase = TaskPhase::kForward;
  int iteration = 0;
  int stage = 0;       // display: stage slot in round (RoundPipe) or stage id (baselines)
  int microbatch = 0;  // global within the iteration; -1 for optimizer / uploads
  int layer = -1;      // optimizer tasks: the layer they step (-1: all layers)
  // The share of duration_s that may run before the tail_only dependencies are met (a backward
  // stage's recompute); the tail starts once they are and the head is done. The resource is
  // held meanwhile (it waits in between, as the device does).
  double head_fraction = 0;
};

// One DispatchPlan slot's tasks in a RoundPipe schedule (-1: none): its weight upload, its
// micro-batches (consecutive ids), its gradient download.
struct SlotTasks {
  int upload = -1;
  int first = -1;
  int count = 0;
  int grad_download = -1;
};

struct SimSchedule {
  std::string name;
  int num_workers = 0;    // GPU workers = resources 0..num_workers-1
  int num_resources = 0;  // >= num_workers; extra resources are not counted as GPU time
  std::vector<std::string> resource_names;
  int iterations = 1;
  // How Balanced() equalizes stage times: RoundPipe's asymmetric partition aims at ONE slot
  // time for forward and backward slots alike (true); weight-bound baselines balance forward
  // and backward stage times separately (false).
  bool balance_all_phases_together = false;
  std::vector<SimTask> tasks;
  std::vector<std::vector<int>> order;  // per resource: task ids in execution order
  std::vector<SlotTasks> slots;         // RoundPipe schedules: per DispatchPlan slot

  // Appends a task at the end of its resource's order; returns its id.
  int Add(SimTask t);
};

}  // namespace rp::planning
