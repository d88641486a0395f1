// heap_policy.cc — see heap_policy.h.
#include "server/process/heap_policy.h"

#include <malloc.h>

namespace rp::process {

bool ApplyDaemonHeapPolicy() {
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThresholdBytes)) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace rp::process
