#include "server/process/thread_stack_floor.h"

#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>

namespace {

using SetStackSizeFn = int (*)(pthread_attr_t*, size_t);

SetStackSizeFn NextSetStackSize() {
  static SetStackSizeFn next = reinterpret_cast<SetStackSizeFn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return next;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  SetStackSizeFn next = NextSetStackSize();
  if (next == nullptr) return 22;  // EINVAL: cannot happen with a dynamically linked libc
  return next(attr, std::max(size, rp::process::kThreadStackFloorBytes));
}

namespace rp::process {

bool ThreadStackFloorActive() {
  // Resolve the symbol the way other libraries do (global scope) and compare with ours.
  void* global = dlsym(RTLD_DEFAULT, "pthread_attr_setstacksize");
  return global == reinterpret_cast<void*>(&::pthread_attr_setstacksize);
}

}  // namespace rp::process
