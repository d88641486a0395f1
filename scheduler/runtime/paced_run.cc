#include "scheduler/runtime/paced_run.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/lost_worker_sim.h"
#include "scheduler/planning/schedules.h"
#include "scheduler/planning/simulator.h"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/profile_costs.h"
#include "workers/device/pacer.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler::runtime {
namespace {

// How much of [a0, a1] lies in [b0, b1].
double Overlap(double a0, double a1, double b0, double b1) {
  return std::max(0.0, std::min(a1, b1) - std::max(a0, b0));
}

constexpr double kFreeLinkBytesPerS = 1e18;  // transfers off: a copy takes no time

std::shared_ptr<const workers::Pacer> MakePacer(const PacedRunOptions& o, absl::Status* error) {
  workers::PacerOptions po;
  for (const planning::LayerCost& l : o.profile.costs.layers) po.layers.push_back({l.fwd_s, l.bwd_s, l.fused_s});
  po.time_scale = o.time_scale;
  po.link_bytes_per_s = o.transfers ? o.link_bytes_per_s : kFreeLinkBytesPerS;
  auto p = workers::Pacer::Create(std::move(po));
  if (!p.ok()) {
    *error = p.status();
    return nullptr;
  }
  return std::shared_ptr<const workers::Pacer>(std::move(*p));
}

absl::Status CheckOptions(const PacedRunOptions& o) {
  if (o.profile.costs.num_layers() != o.model.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("paced run: the profile has ", o.profile.costs.num_layers(),
                                                   " layers, the model ", o.model.num_layers()));
  }
  if (o.iterations < 1 || o.warmup < 1) return absl::InvalidArgumentError("paced run: iterations and warmup >= 1");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const workers::Pacer>> MakePacedClock(const PacedRunOptions& o) {
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  absl::Status error;
  auto pacer = MakePacer(o, &error);
  if (!pacer) return error;
  return pacer;
}

absl::StatusOr<planning::CostModel> PacedCosts(const PacedRunOptions& o) {
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  absl::Status error;
  auto pacer = MakePacer(o, &error);
  if (!pacer) return error;
  auto store = workers::HostModelStore::DataFree(o.model, at::kBFloat16, pacer);
  planning::CostModel costs = ProfileBaseCosts(*store, o.microbatch_rows, o.sequence_length, 4096);
  for (size_t l = 0; l < costs.layers.size(); ++l) {
    const planning::LayerCost& t = o.profile.costs.layers[l];
    costs.layers[l].fwd_s = t.fwd_s;
    costs.layers[l].bwd_s = t.bwd_s;
    costs.layers[l].fused_s = t.fused_s;
  }
  return costs;
}

absl::StatusOr<planning::PartitionResult> ChoosePacedPartition(const PacedRunOptions& o, int64_t stage_cap_bytes,
                                                               bool choose_round_size) {
  auto costs = PacedCosts(o);
  if (!costs.ok()) return costs.status();
  planning::PartitionProblem problem{&*costs, o.workers, o.microbatches, stage_cap_bytes};
  planning::SimulatedChoice choice;
  choice.mode = o.async ? planning::OptimizerMode::kAsync : planning::OptimizerMode::kSync;
  choice.choose_round_size = choose_round_size;
  return planning::SimulatedBestPartition(problem, choice);
}

absl::StatusOr<PacedRunResult> RunPaced(const PacedRunOptions& o) {
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  absl::Status error;
  auto pacer = MakePacer(o, &error);
  if (!pacer) return error;
  auto store = workers::HostModelStore::DataFree(o.model, at::kBFloat16, pacer);
  workers::Timeline timeline;
  workers::DeviceOptions dopt;
  dopt.pacer = pacer;
  auto devices = workers::CreateDevices(absl::StrCat("paced:", o.workers), &timeline, dopt);
  if (!devices.ok()) return devices.status();
  std::vector<workers::Device*> devs;
  for (auto& d : *devices) devs.push_back(d.get());
  ControllerOptions co;
  co.partition = o.partition;
  co.microbatches = o.microbatches;
  co.microbatches_per_round = o.microbatches_per_round;
  co.mode = o.async ? planning::OptimizerMode::kAsync : planning::OptimizerMode::kSync;
  co.recompute_ahead = o.recompute_ahead;
  if (o.data_parallel) {
    if (o.rendezvous == nullptr) return absl::InvalidArgumentError("paced run: data_parallel needs a rendezvous store");
    workers::DataParallelOptions dp = *o.data_parallel;
    dp.meta_wire_scale = o.time_scale;
    auto group = workers::DataParallelGroup::Start(dp, o.rendezvous);
    if (!group.ok()) return group.status();
    if (dp.shard_optimizer_state) (*group)->AssignOwners(workers::OwnerElements(*store));
    co.data_parallel = *group;
  }
  auto controller = Controller::Create(co, store.get(), devs, &timeline);
  if (!controller.ok()) return controller.status();
  Controller& c = **controller;
  const at::Tensor tokens = at::zeros({o.microbatches * o.microbatch_rows, o.sequence_length}, at::kLong);
  const int total = o.warmup + o.iterations + 1;  // + a trailing iteration (see the bubble)
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> ids;
  for (int k = 0; k < total; ++k) {
    if (o.async && ids.size() >= 2) {
      auto st = c.AwaitIteration(ids[ids.size() - 2]);
      if (!st.ok()) return st.status();
    }
    auto id = c.SubmitIteration(tokens);
    if (!id.ok()) return id.status();
    ids.push_back(*id);
  }
  if (o.async) {
    for (size_t k = ids.size() >= 2 ? ids.size() - 2 : 0; k < ids.size(); ++k) {
      auto st = c.AwaitIteration(ids[k]);
      if (!st.ok()) return st.status();
    }
  }
  if (absl::Status s = c.Flush(); !s.ok()) return s;
  PacedRunResult r;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (co.data_parallel) {
    const workers::DataParallelGroup::Traffic t = co.data_parallel->traffic();
    r.collective_wall_s = t.seconds / total;
    r.collective_bytes = static_cast<double>(t.bytes) / total;
  }

  // The engine's own timeline: compute-stream operations by iteration.
  const std::vector<workers::TimelineEntry> entries = timeline.Entries();
  const int first_iteration = ids.front();
  std::map<int, double> iteration_end, iteration_start;
  for (const auto& e : entries) {
    if (e.stream != "compute" || e.iteration < 0) continue;
    double& end = iteration_end[e.iteration];
    end = std::max(end, e.end_s);
    auto [it, fresh] = iteration_start.try_emplace(e.iteration, e.start_s);
    if (!fresh) it->second = std::min(it->second, e.start_s);
  }
  const int w_last = first_iteration + o.warmup - 1, last = w_last + o.iterations;
  if (!iteration_end.count(w_last) || !iteration_end.count(last)) {
    return absl::InternalError("paced run: the timeline lost iterations (too many entries?)");
  }
  const double win0 = iteration_end[w_last], win1 = iteration_end[last];
  const double scale = o.time_scale;
  r.period_s = (win1 - win0) / o.iterations / scale;
  for (int k = w_last + 1; k <= last; ++k)
    r.iteration_period_s.push_back((iteration_end[k] - iteration_end[k - 1]) / scale);
  double busy = 0;
  std::map<std::pair<int, int>, workers::TimelineEntry> first_of_slot;
  const int S = o.partition.num_stages();
  for (const auto& e : entries) {
    if (e.stream != "compute" || e.iteration < 0) continue;
    busy += Overlap(e.start_s, e.end_s, win0, win1);
    const std::pair<int, int> key{e.iteration, e.slot % S};
    auto [it, fresh] = first_of_slot.try_emplace(key, e);
    if (!fresh && e.start_s < it->second.start_s) it->second = e;
  }
  // Busy time inside the window; a trailing iteration after the last measured one fills the
  // last one's drain, as the next iteration does in steady state.
  r.bubble = 1 - busy / (o.workers * (win1 - win0));
  const double origin = iteration_start[w_last + 1];
  for (const auto& [key, e] : first_of_slot) {
    if (key.first <= w_last) continue;
    r.starts.push_back({key.first - first_iteration, key.second, e.worker, (e.start_s - origin) / scale});
  }
  std::sort(r.starts.begin(), r.starts.end(), [](const SlotStart& a, const SlotStart& b) {
    return a.start_s != b.start_s ? a.start_s < b.start_s
                                  : std::tie(a.iteration, a.slot) < std::tie(b.iteration, b.slot);
  });
  return r;
}

namespace {

planning::DispatchOptions PacedDispatch(const PacedRunOptions& o, int iterations) {
  planning::DispatchOptions d;
  d.num_workers = o.workers;
  d.microbatches_per_iteration = o.microbatches;
  d.microbatches_per_round = o.microbatches_per_round;
  d.iterations = iterations;
  d.mode = o.async ? planning::OptimizerMode::kAsync : planning::OptimizerMode::kSync;
  return d;
}

planning::SimOptions PacedSimOptions(const PacedRunOptions& o) {
  planning::SimOptions so;
  so.transfers = o.transfers;
  so.host_link_bandwidth = o.link_bytes_per_s;
  so.recompute_ahead = o.recompute_ahead;
  return so;
}

// Each measured iteration's period (RunPaced's iteration_period_s) from iteration ends.
std::vector<double> MeasuredPeriods(const PacedRunOptions& o, const std::vector<double>& end) {
  std::vector<double> periods;
  for (int k = o.warmup; k < o.warmup + o.iterations && k < static_cast<int>(end.size()); ++k) {
    periods.push_back(end[static_cast<size_t>(k)] - end[static_cast<size_t>(k - 1)]);
  }
  return periods;
}

}  // namespace

absl::StatusOr<planning::SimSchedule> PacedSchedule(const PacedRunOptions& o, int iterations) {
  auto costs = PacedCosts(o);
  if (!costs.ok()) return costs.status();
  auto plan = planning::BuildDispatchPlan(o.partition, costs->num_layers(), PacedDispatch(o, iterations));
  if (!plan.ok()) return plan.status();
  return planning::RoundPipeSchedule(*plan, *costs, PacedSimOptions(o));
}

absl::StatusOr<SimulatedLoss> SimulatePacedLoss(const PacedRunOptions& o, const planning::LostWorkerFault& fault) {
  const int total = o.warmup + o.iterations + 1;  // as RunPaced
  auto costs = PacedCosts(o);
  if (!costs.ok()) return costs.status();
  auto clean = PacedSchedule(o, total);
  if (!clean.ok()) return clean.status();
  auto clean_run = planning::Simulate(*clean);
  if (!clean_run.ok()) return clean_run.status();
  auto lost = planning::SimulateLostWorker(o.partition, *costs, PacedDispatch(o, total), PacedSimOptions(o), fault);
  if (!lost.ok()) return lost.status();
  SimulatedLoss r;
  r.clean_period_s = MeasuredPeriods(o, clean_run->iteration_end);
  r.lost_period_s = MeasuredPeriods(o, lost->iteration_end);
  r.lost_worker = lost->lost_worker;
  r.slots_rerun = lost->slots_rerun;
  return r;
}

absl::StatusOr<SimulatedRun> SimulatePaced(const PacedRunOptions& o) {
  const int total = o.warmup + o.iterations + 1;  // + a trailing iteration, as RunPaced
  auto schedule = PacedSchedule(o, total);
  if (!schedule.ok()) return schedule.status();
  auto sim = planning::Simulate(*schedule);
  if (!sim.ok()) return sim.status();
  const auto& end = sim->iteration_end;
  if (static_cast<int>(end.size()) < total) return absl::InternalError("simulator: missing iterations");
  const double win0 = end[static_cast<size_t>(o.warmup - 1)], win1 = end[static_cast<size_t>(total - 2)];
  SimulatedRun r;
  r.period_s = (win1 - win0) / o.iterations;
  double busy = 0;
  std::map<std::pair<int, int>, std::pair<double, int>> first_of_slot;
  double origin = 1e300;
  for (size_t t = 0; t < schedule->tasks.size(); ++t) {
    const planning::SimTask& task = schedule->tasks[t];
    if (task.resource >= o.workers) continue;
    // Work, not occupancy: a backward task may hold its worker while it waits for its gradient.
    const double span = sim->finish[t] - sim->start[t];
    if (span > 0) busy += Overlap(sim->start[t], sim->finish[t], win0, win1) * task.duration_s / span;
    if (task.iteration < o.warmup) continue;
    if (task.iteration == o.warmup) origin = std::min(origin, sim->start[t]);
    const std::pair<int, int> key{task.iteration, task.stage};
    auto [it, fresh] = first_of_slot.try_emplace(key, sim->start[t], task.resource);
    if (!fresh && sim->start[t] < it->second.first) it->second = {sim->start[t], task.resource};
  }
  r.bubble = 1 - busy / (o.workers * (win1 - win0));
  for (const auto& [key, v] : first_of_slot) r.starts.push_back({key.first, key.second, v.second, v.first - origin});
  std::sort(r.starts.begin(), r.starts.end(), [](const SlotStart& a, const SlotStart& b) {
    return a.start_s != b.start_s ? a.start_s < b.start_s
                                  : std::tie(a.iteration, a.slot) < std::tie(b.iteration, b.slot);
  });
  return r;
}

}  // namespace rp::scheduler::runtime
