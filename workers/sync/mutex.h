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

namespace rp::workers {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { m_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { m_.unlock(); }

 private:
  std::mutex m_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

class CondVar {
 public:
  // Releases `mu` while waiting; holds it again on return (spurious wake-ups happen: loop).
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { cv_.wait(*mu); }
  // The same, at most `timeout`; false when it timed out.
  bool WaitFor(Mutex* mu, std::chrono::milliseconds timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return cv_.wait_for(*mu, timeout) == std::cv_status::no_timeout;
  }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace rp::workers
