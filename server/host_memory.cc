#include "server/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rp::server {

int64_t ParseMemAvailable(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) return -1;
    int64_t kib = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) || kib < 0 || kib > (int64_t{1} << 52)) return -1;
    return kib * 1024;
  }
  return -1;
}

int64_t HostMemoryBudgetNow() {
  std::ifstream in("/proc/meminfo");
  std::stringstream ss;
  ss << in.rdbuf();
  int64_t available = ParseMemAvailable(ss.str());
  if (available < 0) available = static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  return available / 4 * 3;
}

int64_t AdmissionBudget(int64_t budget_now, int64_t held_by_jobs, int64_t parses_in_flight) {
  return std::max<int64_t>(0, budget_now + held_by_jobs / 4 * 3 - parses_in_flight);
}

}  // namespace rp::server
