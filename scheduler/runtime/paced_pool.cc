#include "scheduler/runtime/paced_pool.h"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/pool_simulator.h"
#include "scheduler/runtime/controller.h"
#include "workers/base/mutex.h"
#include "workers/device/compute_gate.h"
#include "workers/device/device.h"
#include "workers/device/lane_device.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// One job of the pool: its clock, data-free store, lanes and controller.
struct PoolJob {
  std::shared_ptr<const workers::Pacer> pacer;
  std::shared_ptr<workers::HostModelStore> store;
  std::vector<std::unique_ptr<workers::LaneDevice>> lanes;
  std::unique_ptr<Controller> controller;
  std::vector<double> done_at;  // seconds since the start, per iteration (its thread only)
  std::atomic<size_t> completed{0};
  absl::Status status;
};

// Submits the job's iterations (async: one in flight across the boundary) and records when each
// one finished.
void RunIterations(const PacedRunOptions& o, PoolJob& j, Clock::time_point t0) {
  Controller& c = *j.controller;
  const at::Tensor tokens = at::zeros({o.microbatches * o.microbatch_rows, o.sequence_length}, at::kLong);
  const int total = o.warmup + o.iterations;
  std::vector<int> ids;
  auto await = [&](int id) {
    auto st = c.AwaitIteration(id);
    if (!st.ok()) j.status = st.status();
    j.done_at.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    ++j.completed;
    return st.ok();
  };
  for (int k = 0; k < total && j.status.ok(); ++k) {
    if (o.async && ids.size() >= 2 && !await(ids[ids.size() - 2])) return;
    if (!o.async && !ids.empty() && !await(ids.back())) return;
    auto id = c.SubmitIteration(tokens);
    if (!id.ok()) {
      j.status = id.status();
      return;
    }
    ids.push_back(*id);
  }
  const size_t first_open = o.async && ids.size() >= 2 ? ids.size() - 2 : ids.size() - 1;
  for (size_t k = first_open; k < ids.size(); ++k) {
    if (!await(ids[k])) return;
  }
  if (absl::Status s = c.Flush(); !s.ok()) j.status = s;
}

double ComputeSeconds(const PoolJob& j) {
  double s = 0;
  for (const auto& l : j.lanes) s += l->compute_seconds();
  return s;
}

// The shared workers and gates, and each job's clock, store, lanes and controller.
struct Pool {
  workers::Timeline timeline;
  std::vector<std::unique_ptr<workers::Device>> devices;
  std::vector<std::unique_ptr<workers::ComputeGate>> gates;
  std::vector<PoolJob> jobs;
};

absl::Status BuildPool(const PacedPoolOptions& o, Pool& pool) {
  const PacedRunOptions& first = o.jobs.front().run;
  for (const PacedPoolJob& pj : o.jobs) {
    if (pj.run.workers != first.workers || pj.run.time_scale != first.time_scale ||
        pj.run.transfers != first.transfers || pj.run.link_bytes_per_s != first.link_bytes_per_s) {
      return absl::InvalidArgumentError("paced pool: every job needs the same workers, time scale and links");
    }
  }
  auto device_clock = MakePacedClock(first);
  if (!device_clock.ok()) return device_clock.status();
  workers::DeviceOptions dopt;
  dopt.pacer = *device_clock;
  auto devices = workers::CreateDevices(absl::StrCat("paced:", first.workers), &pool.timeline, dopt);
  if (!devices.ok()) return devices.status();
  pool.devices = std::move(*devices);
  for (size_t d = 0; d < pool.devices.size(); ++d) pool.gates.push_back(std::make_unique<workers::ComputeGate>());
  pool.jobs = std::vector<PoolJob>(o.jobs.size());
  for (size_t k = 0; k < pool.jobs.size(); ++k) {
    const PacedPoolJob& pj = o.jobs[k];
    auto clock = MakePacedClock(pj.run);
    if (!clock.ok()) return clock.status();
    PoolJob& j = pool.jobs[k];
    j.pacer = *clock;
    j.store = workers::HostModelStore::DataFree(pj.run.model, at::kBFloat16, j.pacer);
    std::vector<workers::Device*> lanes;
    for (size_t d = 0; d < pool.devices.size(); ++d) {
      j.lanes.push_back(std::make_unique<workers::LaneDevice>(pool.devices[d].get(), pool.gates[d].get(), pj.share,
                                                              static_cast<int>(k), j.pacer.get()));
      lanes.push_back(j.lanes.back().get());
    }
    ControllerOptions co;
    co.partition = pj.run.partition;
    co.microbatches = pj.run.microbatches;
    co.microbatches_per_round = pj.run.microbatches_per_round;
    co.mode = pj.run.async ? planning::OptimizerMode::kAsync : planning::OptimizerMode::kSync;
    co.recompute_ahead = pj.run.recompute_ahead;
    co.timeline_job = static_cast<int>(k);
    auto controller = Controller::Create(co, j.store.get(), lanes, &pool.timeline);
    if (!controller.ok()) return controller.status();
    j.controller = std::move(*controller);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PacedPoolResult> RunPacedPool(const PacedPoolOptions& o) {
  if (o.jobs.empty()) return absl::InvalidArgumentError("paced pool: no jobs");
  const PacedRunOptions& first = o.jobs.front().run;
  Pool pool;
  if (absl::Status st = BuildPool(o, pool); !st.ok()) return st;
  std::vector<PoolJob>& jobs = pool.jobs;

  // Each job on a thread of its own (side by side) or one after another. The first job to end
  // snapshots every job's compute time: the split while all of them ran.
  base::Mutex mu;
  bool first_ended = false;
  std::vector<double> compute_at_first_end(jobs.size(), 0);
  std::vector<size_t> iterations_at_first_end(jobs.size(), 0);
  double first_end_s = 0;
  const auto t0 = Clock::now();
  auto run_job = [&](size_t k) {
    if (o.side_by_side && o.jobs[k].start_s > 0) {
      std::this_thread::sleep_until(t0 + std::chrono::duration<double>(o.jobs[k].start_s * first.time_scale));
    }
    RunIterations(o.jobs[k].run, jobs[k], t0);
    base::MutexLock lock(&mu);
    if (first_ended) return;
    first_ended = true;
    first_end_s = std::chrono::duration<double>(Clock::now() - t0).count();
    for (size_t i = 0; i < jobs.size(); ++i) {
      compute_at_first_end[i] = ComputeSeconds(jobs[i]);
      iterations_at_first_end[i] = jobs[i].completed.load();
    }
  };
  if (o.side_by_side) {
    std::vector<std::thread> threads;
    for (size_t k = 0; k < jobs.size(); ++k) threads.emplace_back(run_job, k);
    for (auto& t : threads) t.join();
  } else {
    for (size_t k = 0; k < jobs.size(); ++k) run_job(k);
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  PacedPoolResult r;
  const double scale = first.time_scale;
  r.wall_s = wall;
  double compute = 0;
  for (size_t k = 0; k < jobs.size(); ++k) {
    if (!jobs[k].status.ok()) return jobs[k].status;
    r.job_end_s.push_back(jobs[k].done_at.empty() ? 0 : jobs[k].done_at.back() / scale);
    r.iteration_end_s.emplace_back();
    for (double at : jobs[k].done_at) r.iteration_end_s.back().push_back(at / scale);
    r.makespan_s = std::max(r.makespan_s, r.job_end_s.back());
    compute += ComputeSeconds(jobs[k]);
  }
  r.utilisation = compute / (first.workers * std::max(wall, 1e-9));
  double split_total = 0;
  for (double c : compute_at_first_end) split_total += c;
  for (size_t k = 0; k < jobs.size(); ++k) {
    r.compute_split.push_back(split_total > 0 ? compute_at_first_end[k] / split_total : 0);
    r.iterations_per_s.push_back(first_end_s > 0 ? iterations_at_first_end[k] / (first_end_s / scale) : 0);
  }
  for (PoolJob& j : jobs) j.controller.reset();  // before the lanes, the gates and the devices
  return r;
}

absl::StatusOr<PacedPoolResult> SimulatePacedPool(const PacedPoolOptions& o) {
  if (o.jobs.empty()) return absl::InvalidArgumentError("paced pool: no jobs");
  std::vector<planning::PoolSimJob> jobs;
  for (const PacedPoolJob& pj : o.jobs) {
    auto schedule = PacedSchedule(pj.run, pj.run.warmup + pj.run.iterations);
    if (!schedule.ok()) return schedule.status();
    jobs.push_back({*std::move(schedule), pj.share, o.side_by_side ? pj.start_s : 0, pj.run.async});
  }
  planning::PoolSimOptions po;
  po.hold_max_s =
      std::chrono::duration<double>(workers::ComputeGate::kAnticipation).count() / o.jobs.front().run.time_scale;
  PacedPoolResult r;
  if (o.side_by_side) {
    auto sim = planning::SimulatePool(jobs, po);
    if (!sim.ok()) return sim.status();
    for (const planning::PoolSimJobResult& j : sim->jobs) {
      r.job_end_s.push_back(j.end_s);
      r.iteration_end_s.push_back(j.iteration_end);
    }
    r.makespan_s = sim->makespan_s;
    r.utilisation = sim->utilisation;
    r.compute_split = sim->compute_split;
    r.iterations_per_s = sim->iterations_per_s;
    return r;
  }
  double compute = 0;
  for (planning::PoolSimJob& job : jobs) {
    job.start_s = r.makespan_s;
    auto alone = planning::SimulatePool({job}, po);
    if (!alone.ok()) return alone.status();
    r.makespan_s = alone->makespan_s;
    r.job_end_s.push_back(alone->makespan_s);
    r.iteration_end_s.push_back(alone->jobs.front().iteration_end);
    compute += alone->jobs.front().compute_s;
  }
  r.utilisation = compute / (o.jobs.front().run.workers * r.makespan_s);
  return r;
}

}  // namespace rp::scheduler::runtime
