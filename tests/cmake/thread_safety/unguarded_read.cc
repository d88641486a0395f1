// Must fail clang's -Wthread-safety (deploy/thread-safety.sh runs it first and requires the
// error, so a toolchain or flag change that silently disables the analysis fails the check).
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

class Counter {
 public:
  int Read() const { return value_; }  // reads guarded state without the lock

 private:
  mutable absl::Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

int ThreadSafetyProbe() { return Counter().Read(); }
