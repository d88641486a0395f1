// paced_run.h — (runtime) the engine's schedule measured at the paper's scale without a GPU:
// the real Controller, DispatchPlan, consistency protocol, activation store and optimizer
// worker on paced workers (workers/device/paced_device.h) and a data-free host store, timed
// from the engine's own timeline, next to `roundpipe-sim` on the same profile, partition and
// options. Every figure it gives is a paced figure (real-time equivalents of scaled sleeps).
//
// Contract: RunPaced blocks for about iterations x iteration time x time_scale of wall time;
// thread-safe with respect to other RunPaced calls (each builds its own workers and store).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/planning/comparison.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/planning/lost_worker_sim.h"
#include "scheduler/planning/partition.h"
#include "scheduler/planning/profile_file.h"
#include "scheduler/planning/sim_schedule.h"
#include "workers/data_parallel.h"
#include "workers/device/pacer.h"
#include "workers/spec/model_config.h"

namespace rp::scheduler::runtime {

struct PacedRunOptions {
  planning::Profile profile;  // per-layer times (engine order)
  spec::ModelConfig model;    // shapes: what the copies move
  planning::Partition partition;
  int workers = 8;                 // N
  int microbatches = 16;           // M
  int microbatches_per_round = 0;  // M_R (0 = M)
  bool async = false;              // optimizer mode
  bool recompute_ahead = true;
  // Transfers on: copies take bytes / link_bytes_per_s; off: they are free, like the
  // simulator without --transfers.
  bool transfers = false;
  double link_bytes_per_s = 25e9;
  int64_t microbatch_rows = 4;
  int64_t sequence_length = 2048;
  double time_scale = 0.05;
  int iterations = 6;  // measured after the first `warmup` iterations
  int warmup = 2;
  // One node of a data-parallel group (a cluster benchmark; workers/data_parallel.h): RunPaced
  // joins the group through `rendezvous` (the other nodes run RunPaced at the same time) and its
  // gradients cross the group's communicators: real bytes on real links, scaled by time_scale
  // like every paced duration (DataParallelOptions::meta_wire_scale). Unset: a single node.
  std::optional<workers::DataParallelOptions> data_parallel;
  spec::RendezvousStore* rendezvous = nullptr;
};

// One stage slot's compute as it started, in order of start (the first micro-batch of each slot).
struct SlotStart {
  int iteration = 0;
  int slot = 0;
  int worker = 0;
  double start_s = 0;  // real-time equivalent since the first measured iteration's start
};

struct PacedRunResult {
  double period_s = 0;  // real-time equivalent per iteration, steady state
  double bubble = 0;    // 1 - compute busy / (N x window) over the measured iterations
  double wall_s = 0;    // what the run took
  std::vector<SlotStart> starts;
  std::vector<double> iteration_period_s;  // each measured iteration's period (noise)
  // With data_parallel: per iteration (every iteration run, warm-up included), this node's wall
  // seconds inside collectives (not scaled) and the fp32 bytes it put into them.
  double collective_wall_s = 0;
  double collective_bytes = 0;
};

absl::StatusOr<PacedRunResult> RunPaced(const PacedRunOptions& options);

// The simulator's steady state for the same run: the profile's times, the store's byte counts
// with transfers on, the same partition, mode and recompute rule.
struct SimulatedRun {
  double period_s = 0;
  double bubble = 0;
  std::vector<SlotStart> starts;  // one iteration after warm-up, relative to its first start
};
absl::StatusOr<SimulatedRun> SimulatePaced(const PacedRunOptions& options);

// The simulator's schedule of `iterations` iterations of the run (its costs, partition, mode,
// workers and links).
absl::StatusOr<planning::SimSchedule> PacedSchedule(const PacedRunOptions& options, int iterations);

// The simulator's figures for a RunPaced that loses a worker (planning/lost_worker_sim.h): each
// measured iteration's period without and with the loss (RunPaced's iteration_period_s).
struct SimulatedLoss {
  std::vector<double> clean_period_s, lost_period_s;
  int lost_worker = 0;
  int slots_rerun = 0;
};
absl::StatusOr<SimulatedLoss> SimulatePacedLoss(const PacedRunOptions& options, const planning::LostWorkerFault& fault);

// The paced workers' clock for a run's profile, time scale and links.
absl::StatusOr<std::shared_ptr<const workers::Pacer>> MakePacedClock(const PacedRunOptions& options);

// Profile times plus the model's byte counts (what both sides see).
absl::StatusOr<planning::CostModel> PacedCosts(const PacedRunOptions& options);

// The partition the simulator picks for the run's costs, workers, micro-batches and optimizer
// mode (planning::SimulatedBestPartition; `stage_cap_bytes` 0: no memory cap), which the
// benchmarks then run.
absl::StatusOr<planning::PartitionResult> ChoosePacedPartition(const PacedRunOptions& options, int64_t stage_cap_bytes,
                                                               bool choose_round_size = false);

}  // namespace rp::scheduler::runtime
