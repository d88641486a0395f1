// thread_stack_floor.h — a process-wide minimum for explicitly requested thread stack sizes.
//
// Why: glibc carves a new thread's static TLS out of its stack. LibTorch + the CUDA wheels bring
// ~250 KiB of static TLS, while Debian's civetweb (under prometheus-cpp's Exposer) asks for
// 100 KiB worker stacks (its USE_STACK_SIZE build option), so pthread_create fails with EINVAL
// and the Exposer throws "null context when constructing CivetServer".
//
// How: linking the rp_thread_stack_floor OBJECT library into an executable defines
// pthread_attr_setstacksize there (exported), interposing the libc one for every library in
// the process; it forwards to libc with max(requested, kThreadStackFloorBytes). Raising a
// requested stack size is always safe. Thread-safe; no state besides the cached libc pointer.
#pragma once

#include <cstddef>

namespace rp::process {

inline constexpr std::size_t kThreadStackFloorBytes = std::size_t{2} << 20;  // 2 MiB

// True when the interposer is the pthread_attr_setstacksize this process uses.
bool ThreadStackFloorActive();

}  // namespace rp::process
