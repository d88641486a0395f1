#include "scheduler/runtime/slot_recovery.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace rp::scheduler::runtime {

SlotRecovery::SlotRecovery(std::vector<workers::DeviceWorker*> workers, int timeline_job)
    : workers_(std::move(workers)), timeline_job_(timeline_job) {
  for (workers::DeviceWorker* w : workers_) {
    losses_at_start_.push_back(w->device()->health().losses());
    listener_ids_.push_back(w->device()->health().AddListener([this] { Poke(); }));
  }
  thread_ = std::thread([this] { Loop(); });
}

SlotRecovery::~SlotRecovery() {
  for (size_t i = 0; i < workers_.size(); ++i) workers_[i]->device()->health().RemoveListener(listener_ids_[i]);
  {
    base::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  thread_.join();
  passes_.clear();  // the spare lanes drain (their runs finished: the controller waited for them)
}

workers::EventPtr SlotRecovery::Submit(int worker, const workers::StageTask& task,
                                       std::shared_ptr<workers::RunContext> ctx) {
  workers::DeviceWorker* w = workers_[static_cast<size_t>(worker)];
  auto attempt =
      std::make_shared<workers::SlotAttempt>(std::make_shared<workers::SlotLedger>(), &w->device()->health());
  attempt->set_on_fault([this] { Poke(); });
  Run r;
  r.task = task;
  r.ctx = ctx;
  r.attempt = attempt;
  r.drained = w->Submit(task, std::move(ctx), attempt);
  workers::EventPtr done = attempt->ledger().done();
  base::MutexLock lock(&mu_);
  r.seq = next_seq_++;
  runs_.push_back(std::move(r));
  return done;
}

std::vector<int> SlotRecovery::Usable() const {
  std::vector<int> usable;
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->device()->health().usable()) usable.push_back(static_cast<int>(i));
  }
  return usable;
}

void SlotRecovery::Poke() {
  {
    base::MutexLock lock(&mu_);
    poked_ = true;
  }
  cv_.SignalAll();
}

int SlotRecovery::Forget(int iteration) {
  base::MutexLock lock(&mu_);
  runs_.erase(
      std::remove_if(runs_.begin(), runs_.end(), [iteration](const Run& r) { return r.task.iteration == iteration; }),
      runs_.end());
  auto it = rerun_by_iteration_.find(iteration);
  if (it == rerun_by_iteration_.end()) return 0;
  const int n = it->second;
  rerun_by_iteration_.erase(it);
  return n;
}

std::vector<OutOfMemoryRun> SlotRecovery::TakeOutOfMemory() {
  base::MutexLock lock(&mu_);
  return std::exchange(out_of_memory_, {});
}

int64_t SlotRecovery::slots_rerun() const {
  base::MutexLock lock(&mu_);
  return slots_rerun_;
}

int SlotRecovery::workers_lost() const {
  int64_t n = 0;
  for (size_t i = 0; i < workers_.size(); ++i) n += workers_[i]->device()->health().losses() - losses_at_start_[i];
  return static_cast<int>(n);
}

void SlotRecovery::Loop() {
  for (;;) {
    {
      base::MutexLock lock(&mu_);
      while (!stop_ && !poked_) cv_.Wait(&mu_);
      if (stop_) return;
      poked_ = false;
    }
    RecoverPass();
  }
}

void SlotRecovery::RecoverPass() {
  // The unhandled runs on lost devices, in submission order (a slot only waits for earlier ones).
  std::vector<Run> dead;
  {
    base::MutexLock lock(&mu_);
    for (Run& r : runs_) {
      if (r.handled || !(r.attempt->device_lost() || r.attempt->out_of_memory())) continue;
      r.handled = true;
      dead.push_back(r);
    }
  }
  if (dead.empty()) return;
  DropIdlePasses();
  std::sort(dead.begin(), dead.end(), [](const Run& a, const Run& b) { return a.seq < b.seq; });
  std::vector<Spare>& spares = passes_.emplace_back();
  size_t next_spare = 0;
  for (Run& r : dead) {
    if (r.attempt->device_lost()) {
      // A lost device's streams skip everything and end their waits: this returns at once, or
      // after an operation that was running when the device was lost.
      r.drained->Wait();
    } else {
      // Out of memory on a working device: not waited for (its later slots may wait for this
      // one's outputs); what the run still does skips its work, Once keeps its effects single.
      base::MutexLock lock(&mu_);
      out_of_memory_.push_back({r.task, r.attempt->out_of_memory_what()});
      ++r.out_of_memory_runs;
    }
    if (!r.attempt->Abandon() || r.attempt->ledger().complete()) continue;  // it had finished
    if (r.out_of_memory_runs >= kMaxOutOfMemoryRuns) {
      r.ctx->Fail(absl::ResourceExhaustedError(absl::StrCat(
          "stage slot ", r.task.slot, " (layers ", r.task.first_layer, "..", r.task.first_layer + r.task.num_layers - 1,
          ") ran out of device memory ", r.out_of_memory_runs, " times (the last: ", r.attempt->out_of_memory_what(),
          "); lower JobSpec.stage_memory_cap or the micro-batch size")));
      workers::SettleSlot(r.task, r.attempt->ledger());
      continue;
    }
    Rerun(r, spares, next_spare);
  }
}

void SlotRecovery::Rerun(const Run& dead, std::vector<Spare>& spares, size_t& next_spare) {
  if (spares.empty()) {
    // This pass's lanes: one fresh lane on every survivor.
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (workers_[i]->device()->health().lost()) continue;  // a drained one still works: use it
      Spare sp;
      sp.lane = std::make_unique<workers::LaneDevice>(workers_[i]->device(), nullptr, 1.0, timeline_job_);
      sp.worker = std::make_unique<workers::DeviceWorker>(sp.lane.get());
      spares.push_back(std::move(sp));
    }
  }
  if (spares.empty()) {
    dead.ctx->Fail(absl::UnavailableError(
        absl::StrCat("every worker of the job is lost (the last: ", dead.attempt->health()->why().message(), ")")));
    workers::SettleSlot(dead.task, dead.attempt->ledger());
    return;
  }
  Spare& sp = spares[next_spare++ % spares.size()];
  Run r = dead;
  r.attempt = std::make_shared<workers::SlotAttempt>(dead.attempt->shared_ledger(), &sp.lane->health());
  r.attempt->set_rerun();
  r.attempt->set_on_fault([this] { Poke(); });
  r.handled = false;
  r.drained = sp.worker->Submit(r.task, r.ctx, r.attempt);
  sp.worker->Flush();
  sp.drained.push_back(r.drained);
  base::MutexLock lock(&mu_);
  ++rerun_by_iteration_[r.task.iteration];
  runs_.push_back(std::move(r));
  ++slots_rerun_;
}

void SlotRecovery::DropIdlePasses() {
  passes_.erase(std::remove_if(passes_.begin(), passes_.end(),
                               [](const std::vector<Spare>& pass) {
                                 for (const Spare& sp : pass) {
                                   for (const workers::EventPtr& e : sp.drained) {
                                     if (!e->IsSet()) return false;
                                   }
                                 }
                                 return true;
                               }),
                passes_.end());
}

}  // namespace rp::scheduler::runtime
