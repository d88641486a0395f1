// check.h — the one vocabulary for broken invariants, shared by every room (the foundation
// folder workers/base/ is on every library's include view, the daemon's included).
//
// Policy (ARCHITECTURE §6, docs/DAEMON.md "Faults"): user input and the environment (files, disks,
// devices, the network) are never checked with RP_CHECK; they return absl::Status with a message
// naming what to fix. RP_CHECK states what the code itself guarantees — an event counted down
// more often than it has producers, a buffer freed that was never handed out. When one fails the
// program is already wrong, so it does not go on: the message
//   roundpipe: invariant broken at <file>:<line>: <condition>: <context>
// goes to stderr (the journal under systemd), and the process aborts (SIGABRT, a core dump where
// enabled). systemd restarts roundpiped; recovery resumes each job from its last checkpoint.
//
//   RP_CHECK(left >= 1) << "event counted down " << -left << " times too often";
//   RP_CHECK_FAIL() << "unknown stage kind " << static_cast<int>(kind);   // in a switch default
//
// Contract: any thread; the context expression is evaluated only when the check fails. Never
// compiled out (there is no debug-only variant: an invariant worth stating is worth a compare).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "absl/base/optimization.h"

namespace rp::base {

// Writes the message and aborts when destroyed (at the end of the RP_CHECK statement).
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) : file_(file), line_(line), condition_(condition) {}
  CheckFailure(const CheckFailure&) = delete;
  CheckFailure& operator=(const CheckFailure&) = delete;
  [[noreturn]] ~CheckFailure() {
    const std::string context = context_.str();
    std::fprintf(stderr, "roundpipe: invariant broken at %s:%d: %s%s%s\n", file_, line_, condition_,
                 context.empty() ? "" : ": ", context.c_str());
    std::fflush(stderr);
    std::abort();
  }

  std::ostream& stream() { return context_; }

 private:
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream context_;
};

}  // namespace rp::base

// `while` rather than `if`: the statement takes an optional `<< context` and never dangles an else.
#define RP_CHECK(condition) \
  while (ABSL_PREDICT_FALSE(!(condition))) ::rp::base::CheckFailure(__FILE__, __LINE__, #condition).stream()

#define RP_CHECK_FAIL() ::rp::base::CheckFailure(__FILE__, __LINE__, "unreachable").stream()
