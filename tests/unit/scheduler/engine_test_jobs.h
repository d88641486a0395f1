// engine_test_jobs.h — what the engine tests share: a tiny Qwen3 job, the events of a job until
// it ends, a wait for a state. Test-only; included by the engine_*_test.cc files of this folder.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "scheduler/engine.h"
#include "tests/support/tokens.h"

namespace rp::scheduler {

using namespace std::chrono_literals;
using rp::testing::RandomTokens;

inline JobSpec TinyJob() {
  JobSpec s;
  s.name = "tiny";
  s.model.family = "qwen3";
  s.model.vocab = 41;
  s.model.hidden = 16;
  s.model.intermediate = 24;
  s.model.num_blocks = 3;
  s.model.num_heads = 2;
  s.model.num_kv_heads = 1;
  s.model.head_dim = 8;
  s.model.qk_norm = true;
  s.seed = 4;
  s.optimizer.lr = 1e-3;
  s.optimizer.eps = 1e-6;
  return s;
}

// Every event of job `id` until it leaves QUEUED/RUNNING (a failure after 60 s).
inline std::vector<JobEvent> DrainUntilEnded(Engine& e, JobId id) {
  std::vector<JobEvent> all;
  for (int i = 0; i < 600; ++i) {
    auto ev = e.AwaitEvents(id, 100ms);
    EXPECT_TRUE(ev.ok());
    for (auto& x : *ev) all.push_back(x);
    auto st = e.State(id);
    if (*st != JobState::kQueued && *st != JobState::kRunning) {
      auto rest = e.AwaitEvents(id, 0ms);
      for (auto& x : *rest) all.push_back(x);
      return all;
    }
  }
  ADD_FAILURE() << "job did not end";
  return all;
}

// Waits (on the engine's own notification) until job `id` reports state `want`; the events it
// consumes meanwhile are appended to `seen` when given.
inline bool AwaitState(Engine& e, JobId id, JobState want, std::vector<JobEvent>* seen = nullptr) {
  for (int i = 0; i < 300; ++i) {
    if (*e.State(id) == want) return true;
    auto ev = e.AwaitEvents(id, 100ms);
    if (!ev.ok()) return false;
    bool reached = false;
    for (const auto& x : *ev) {
      if (seen) seen->push_back(x);
      reached |= x.kind == JobEvent::Kind::kState && x.state == want;
    }
    if (reached) return true;
  }
  return *e.State(id) == want;
}

}  // namespace rp::scheduler
