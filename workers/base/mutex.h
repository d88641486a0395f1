// mutex.h — std::mutex and std::condition_variable_any with clang's lock annotations: locked
// state declared ABSL_GUARDED_BY(mu) is checked by -Wthread-safety (deploy/thread-safety.sh),
// and ThreadSanitizer still sees every lock (it intercepts pthread; Debian's libabsl is not built
// for TSAN, so absl::Mutex would be invisible to deploy/tsan.sh — the server, which TSAN does not
// cover, uses absl::Mutex directly).
//
// Contract: Mutex is not recursive; CondVar waits release and re-acquire the given Mutex, which
// the caller holds. Any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace rp::base {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { m_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { m_.unlock(); }
  // Tells the analysis what it cannot see: code that runs inside a lock its caller holds (a
  // callback invoked under the lock). Checks nothing at run time.
  void AssumeHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  std::mutex m_;
};

// Holds `mu` for its scope. Unlock() and Lock() release and take it again inside the scope
// (the analysis follows both); the destructor unlocks only what is held.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {
    if (held_) mu_->unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() ABSL_UNLOCK_FUNCTION() {
    held_ = false;
    mu_->unlock();
  }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    mu_->lock();
    held_ = true;
  }

 private:
  Mutex* mu_;
  bool held_ = true;
};

class CondVar {
 public:
  // Releases `mu` while waiting; holds it again on return (spurious wake-ups happen: loop).
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { cv_.wait(*mu); }
  // The same, at most `timeout`; false when it timed out.
  bool WaitFor(Mutex* mu, std::chrono::milliseconds timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return cv_.wait_for(*mu, timeout) == std::cv_status::no_timeout;
  }
  // The same, until `deadline`; false once it has passed. A predicate is waited for as
  //   while (!ready) if (!cv.WaitUntil(&mu, deadline)) break;
  // (a loop, not a lambda: the lock analysis cannot see a lock held inside a lambda).
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return cv_.wait_until(*mu, deadline) == std::cv_status::no_timeout;
  }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace rp::base
