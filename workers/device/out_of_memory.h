// out_of_memory.h — a device that ran out of memory in one operation. Unlike a lost device
// (device_health.h) the device still works: the stage slot that hit it is run again (from the
// host state, slot_recovery.h) and its job re-plans with a tighter per-stage memory cap. A real
// CUDA allocation failure arrives as c10::OutOfMemoryError; on any backend a test injects one
// through the fault hook (test_hooks.h), which the next guarded operation throws as
// DeviceOutOfMemory.
//
// Contract: value types and pure functions; the injection flag is per stream thread.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <stdexcept>
#include <string>

namespace rp::workers {

struct DeviceOutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Whether `e` says the device ran out of memory (ours or LibTorch's allocator's).
inline bool IsOutOfMemory(const std::exception& e) {
  return dynamic_cast<const DeviceOutOfMemory*>(&e) != nullptr ||
         dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr;
}

// An injected out-of-memory for the operation this stream thread runs now: the stream sets it
// before the operation, the operation's guard throws it (ThrowIfOutOfMemoryInjected), the stream
// clears it after.
inline bool& OutOfMemoryInjectedHere() {
  thread_local bool injected = false;
  return injected;
}
inline void ThrowIfOutOfMemoryInjected() {
  if (!OutOfMemoryInjectedHere()) return;
  OutOfMemoryInjectedHere() = false;
  throw DeviceOutOfMemory("out of device memory (injected by a test)");
}

}  // namespace rp::workers
