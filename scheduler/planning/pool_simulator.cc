#include "scheduler/planning/pool_simulator.h"

#include <algorithm>
#include <limits>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "workers/spec/fair_share.h"

namespace rp::planning {
namespace {

constexpr double kUnknown = -1;
constexpr double kNever = std::numeric_limits<double>::infinity();

bool HasTailDeps(const SimTask& t) {
  return std::any_of(t.deps.begin(), t.deps.end(), [](const TaskDep& d) { return d.tail_only; });
}

// One operation on a server: a task, or the head / the tail of a task with tail-only
// dependencies (the engine's recompute, then the backward proper).
struct Op {
  int job = 0;
  int task = 0;
  int part = 0;        // 0: the task or its head; 1: its tail
  bool split = false;  // the task is two operations
  double duration = 0;
  double start = kUnknown;
  double finish = kUnknown;
  double ready = kUnknown;  // once known, it never changes
};

// One job's operations on one server, in the job's order (a stream: one at a time).
struct Lane {
  int job = 0;
  std::vector<int> ops;
  size_t next = 0;
  double free_at = 0;  // its previous operation's end
  int share_id = -1;   // its id in the server's FairShare (workers only)
};

// A pool worker (a lane per job, turns by fair share) or a job's own resource (one lane).
struct Server {
  bool shared = false;
  std::vector<int> lanes;  // ids into PoolRun::lanes_
  double free_at = 0;
  spec::FairShare share;
  bool hold_pending = false;  // an operation ended: decide on a hold before the next grant
  int last_lane = -1;
  double last_duration = 0;
  int reserved = -1;  // a lane the worker is held for, until reserved_until
  double reserved_until = 0;
};

class PoolRun {
 public:
  PoolRun(const std::vector<PoolSimJob>& jobs, const PoolSimOptions& o) : jobs_(jobs), o_(o) {}

  absl::StatusOr<PoolSimResult> Run() {
    if (absl::Status s = Build(); !s.ok()) return s;
    for (size_t done = 0; done < ops_.size();) {
      double best = kNever;
      int at = -1;
      for (size_t s = 0; s < servers_.size(); ++s) {
        const double c = Candidate(servers_[s]);
        if (c < best) {
          best = c;
          at = static_cast<int>(s);
        }
      }
      if (at < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("pool simulation deadlocks with ", ops_.size() - done, " of ", ops_.size(), " operations"));
      }
      Server& sv = servers_[static_cast<size_t>(at)];
      if (sv.hold_pending) {
        ResolveHold(sv);  // time has reached the end of its last operation: decide, then look again
        continue;
      }
      Commit(sv, best);
      ++done;
    }
    return Results();
  }

 private:
  const SimTask& TaskOf(const Op& op) const {
    return jobs_[static_cast<size_t>(op.job)].schedule.tasks[static_cast<size_t>(op.task)];
  }

  absl::Status Build() {
    if (jobs_.empty()) return absl::InvalidArgumentError("pool simulation: no jobs");
    workers_ = jobs_.front().schedule.num_workers;
    if (workers_ < 1) return absl::InvalidArgumentError("pool simulation: no workers");
    servers_.resize(static_cast<size_t>(workers_));
    for (Server& sv : servers_) sv.shared = true;
    start_.resize(jobs_.size());
    finish_.resize(jobs_.size());
    for (size_t j = 0; j < jobs_.size(); ++j) {
      if (absl::Status s = AddJob(static_cast<int>(j)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status AddJob(int j) {
    const PoolSimJob& job = jobs_[static_cast<size_t>(j)];
    const SimSchedule& s = job.schedule;
    if (s.num_workers != workers_) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool simulation: job ", j, " has ", s.num_workers, " workers, the pool ", workers_));
    }
    if (!(job.share > 0)) return absl::InvalidArgumentError(absl::StrCat("pool simulation: job ", j, "'s share <= 0"));
    const size_t T = s.tasks.size();
    size_t ordered = 0;
    for (const auto& o : s.order) ordered += o.size();
    if (ordered != T) {
      return absl::InvalidArgumentError(absl::StrCat("pool simulation: job ", j, " has ", T, " tasks but ", ordered,
                                                     " entries in its resource orders"));
    }
    for (size_t t = 0; t < T; ++t) {
      for (const TaskDep& d : s.tasks[t].deps) {
        if (d.task < 0 || static_cast<size_t>(d.task) >= T || static_cast<size_t>(d.task) == t) {
          return absl::InvalidArgumentError(
              absl::StrCat("pool simulation: job ", j, " task ", t, " has a bad dependency ", d.task));
        }
      }
    }
    start_[static_cast<size_t>(j)].assign(T, kUnknown);
    finish_[static_cast<size_t>(j)].assign(T, kUnknown);
    for (size_t r = 0; r < s.order.size(); ++r) {
      if (s.order[r].empty()) continue;
      const bool shared = static_cast<int>(r) < workers_;
      if (!shared) servers_.emplace_back();
      Server& sv = shared ? servers_[r] : servers_.back();
      Lane lane;
      lane.job = j;
      if (shared) lane.share_id = sv.share.AddLane(job.share);
      for (int t : s.order[r]) AddOps(j, t, lane);
      sv.lanes.push_back(static_cast<int>(lanes_.size()));
      lanes_.push_back(std::move(lane));
    }
    return absl::OkStatus();
  }

  void AddOps(int j, int t, Lane& lane) {
    const SimTask& task = jobs_[static_cast<size_t>(j)].schedule.tasks[static_cast<size_t>(t)];
    const bool split = HasTailDeps(task);
    const double head = split ? task.duration_s * std::clamp(task.head_fraction, 0.0, 1.0) : task.duration_s;
    for (int part = 0; part < (split ? 2 : 1); ++part) {
      Op op;
      op.job = j;
      op.task = t;
      op.part = part;
      op.split = split;
      op.duration = part == 0 ? head : task.duration_s - head;
      lane.ops.push_back(static_cast<int>(ops_.size()));
      ops_.push_back(op);
    }
  }

  // When the operation's dependencies are met (a split task's head waits for the others, its
  // tail for the tail-only ones and its head); kUnknown while one of them has not started.
  double OpReady(int id) {
    Op& op = ops_[static_cast<size_t>(id)];
    if (op.ready != kUnknown) return op.ready;
    double r = jobs_[static_cast<size_t>(op.job)].start_s;
    const auto& start = start_[static_cast<size_t>(op.job)];
    const auto& finish = finish_[static_cast<size_t>(op.job)];
    for (const TaskDep& d : TaskOf(op).deps) {
      if (op.split && d.tail_only != (op.part == 1)) continue;
      const double at = d.on_start ? start[static_cast<size_t>(d.task)] : finish[static_cast<size_t>(d.task)];
      if (at == kUnknown) return kUnknown;
      r = std::max(r, at + d.latency_s);
    }
    if (op.part == 1) r = std::max(r, ops_[static_cast<size_t>(id) - 1].finish);
    op.ready = r;
    return r;
  }

  // When the lane's next operation could start (its dependencies and its previous operation);
  // kNever when it has none, or one of its dependencies has not started.
  double LaneReady(int l) {
    Lane& lane = lanes_[static_cast<size_t>(l)];
    if (lane.next >= lane.ops.size()) return kNever;
    const double r = OpReady(lane.ops[lane.next]);
    return r == kUnknown ? kNever : std::max(r, lane.free_at);
  }

  // When the server's next operation starts, as far as is known now.
  double Candidate(Server& sv) {
    double first = kNever;
    for (int l : sv.lanes) first = std::min(first, LaneReady(l));
    if (sv.reserved >= 0) {
      const double back = LaneReady(sv.reserved);
      if (back <= sv.reserved_until) return std::max(sv.free_at, back);
      first = std::max(first, sv.reserved_until);
    }
    return first == kNever ? kNever : std::max(sv.free_at, first);
  }

  // The lane whose operation ended holds the worker a moment when it has more queued, its next
  // operation is not ready yet, and it would go next (ComputeGate's anticipation). Runs once the
  // simulation's time has reached the end of that operation, so the lanes waiting then are known.
  void ResolveHold(Server& sv) {
    sv.hold_pending = false;
    const int l = sv.last_lane;
    const Lane& lane = lanes_[static_cast<size_t>(l)];
    if (lane.next >= lane.ops.size() || LaneReady(l) <= sv.free_at || !MoreQueued(lane)) return;
    for (int other : sv.lanes) {
      const int id = lanes_[static_cast<size_t>(other)].share_id;
      if (other != l && LaneReady(other) <= sv.free_at && !sv.share.waiting(id)) sv.share.Wait(id);
    }
    if (!sv.share.WouldLead(lane.share_id)) return;
    sv.reserved = l;
    sv.reserved_until = sv.free_at + std::min(o_.hold_max_s, o_.hold_fraction * sv.last_duration);
  }

  // The lane's next operation is already on its stream: of the same iteration as the one that
  // ended (or, async, of the next one, dispatched while this one runs).
  bool MoreQueued(const Lane& lane) const {
    const int done = TaskOf(ops_[static_cast<size_t>(lane.ops[lane.next - 1])]).iteration;
    const int next = TaskOf(ops_[static_cast<size_t>(lane.ops[lane.next])]).iteration;
    return next == done || (jobs_[static_cast<size_t>(lane.job)].async && next == done + 1);
  }

  // Starts the server's next operation at `t`: on a worker, every lane ready by then waits and
  // the fair share picks one.
  void Commit(Server& sv, double t) {
    int l = sv.lanes.front();
    if (sv.shared) {
      sv.reserved = -1;
      for (int c : sv.lanes) {
        const int id = lanes_[static_cast<size_t>(c)].share_id;
        if (LaneReady(c) <= t && !sv.share.waiting(id)) sv.share.Wait(id);
      }
      const std::optional<int> next = sv.share.Next();
      for (int c : sv.lanes) {
        if (lanes_[static_cast<size_t>(c)].share_id == *next) l = c;
      }
    }
    Lane& lane = lanes_[static_cast<size_t>(l)];
    Op& op = ops_[static_cast<size_t>(lane.ops[lane.next++])];
    op.start = t;
    op.finish = t + op.duration;
    lane.free_at = sv.free_at = op.finish;
    if (op.part == 0) start_[static_cast<size_t>(op.job)][static_cast<size_t>(op.task)] = t;
    if (!op.split || op.part == 1) finish_[static_cast<size_t>(op.job)][static_cast<size_t>(op.task)] = op.finish;
    if (sv.shared) {
      sv.share.Charge(lane.share_id, op.duration);
      sv.hold_pending = o_.hold_max_s > 0 && sv.lanes.size() > 1;
      sv.last_lane = l;
      sv.last_duration = op.duration;
    }
  }

  PoolSimResult Results() const {
    PoolSimResult r;
    double compute = 0;
    for (size_t j = 0; j < jobs_.size(); ++j) {
      const SimSchedule& s = jobs_[j].schedule;
      PoolSimJobResult jr;
      jr.start = start_[j];
      jr.finish = finish_[j];
      jr.iteration_end.assign(static_cast<size_t>(std::max(1, s.iterations)), 0);
      for (size_t t = 0; t < s.tasks.size(); ++t) {
        jr.end_s = std::max(jr.end_s, jr.finish[t]);
        if (s.tasks[t].resource >= workers_) continue;
        jr.compute_s += s.tasks[t].duration_s;
        const size_t it = static_cast<size_t>(std::clamp(s.tasks[t].iteration, 0, std::max(1, s.iterations) - 1));
        jr.iteration_end[it] = std::max(jr.iteration_end[it], jr.finish[t]);
      }
      compute += jr.compute_s;
      r.makespan_s = std::max(r.makespan_s, jr.end_s);
      r.first_end_s = j == 0 ? jr.end_s : std::min(r.first_end_s, jr.end_s);
      r.jobs.push_back(std::move(jr));
    }
    r.utilisation = r.makespan_s > 0 ? compute / (workers_ * r.makespan_s) : 0;
    SplitUntilFirstEnd(r);
    return r;
  }

  // Each job's compute and ended iterations until the first job ended.
  void SplitUntilFirstEnd(PoolSimResult& r) const {
    std::vector<double> used(jobs_.size(), 0);
    for (size_t s = 0; s < static_cast<size_t>(workers_); ++s) {
      for (int l : servers_[s].lanes) {
        for (int id : lanes_[static_cast<size_t>(l)].ops) {
          const Op& op = ops_[static_cast<size_t>(id)];
          used[static_cast<size_t>(op.job)] += std::max(0.0, std::min(op.finish, r.first_end_s) - op.start);
        }
      }
    }
    double total = 0;
    for (double u : used) total += u;
    for (size_t j = 0; j < jobs_.size(); ++j) {
      r.compute_split.push_back(total > 0 ? used[j] / total : 0);
      const auto& ends = r.jobs[j].iteration_end;
      const auto ended = std::count_if(ends.begin(), ends.end(), [&](double e) { return e <= r.first_end_s; });
      r.iterations_per_s.push_back(r.first_end_s > 0 ? static_cast<double>(ended) / r.first_end_s : 0);
    }
  }

  const std::vector<PoolSimJob>& jobs_;
  const PoolSimOptions o_;
  int workers_ = 0;
  std::vector<Op> ops_;
  std::vector<Lane> lanes_;
  std::vector<Server> servers_;
  std::vector<std::vector<double>> start_, finish_;  // per job, per task
};

}  // namespace

absl::StatusOr<PoolSimResult> SimulatePool(const std::vector<PoolSimJob>& jobs, const PoolSimOptions& options) {
  return PoolRun(jobs, options).Run();
}

}  // namespace rp::planning
