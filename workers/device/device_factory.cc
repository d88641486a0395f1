// CreateDevices: parses a device spec (device.h) into CPU or CUDA workers.
#include <c10/cuda/CUDAFunctions.h>

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "workers/device/cpu_device.h"
#include "workers/device/cuda_device.h"
#include "workers/device/paced_device.h"

namespace rp::workers {

int VisibleCudaDevices() {
  try {
    return static_cast<int>(c10::cuda::device_count());
  } catch (...) {
    return 0;
  }
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateDevices(const std::string& spec, Timeline* timeline,
                                                                   const DeviceOptions& options) {
  std::vector<std::unique_ptr<Device>> out;
  if (spec.rfind("cpu:", 0) == 0) {
    int n = 0;
    if (!absl::SimpleAtoi(spec.substr(4), &n) || n < 1 || n > 64) {
      return absl::InvalidArgumentError(absl::StrCat("devices '", spec, "': expected cpu:N with 1 <= N <= 64"));
    }
    for (int i = 0; i < n; ++i) out.push_back(std::make_unique<CpuDevice>(i, timeline));
    return out;
  }
  if (spec.rfind("paced:", 0) == 0) {
    int n = 0;
    if (!absl::SimpleAtoi(spec.substr(6), &n) || n < 1 || n > 64) {
      return absl::InvalidArgumentError(absl::StrCat("devices '", spec, "': expected paced:N with 1 <= N <= 64"));
    }
    if (!options.pacer) {
      return absl::InvalidArgumentError(
          absl::StrCat("devices '", spec, "': paced workers need a profile to take their times from"));
    }
    for (int i = 0; i < n; ++i) out.push_back(std::make_unique<PacedDevice>(i, options.pacer, timeline));
    return out;
  }
  if (spec != "cuda" && spec.rfind("cuda:", 0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices '", spec,
                     "': expected cpu:N, cuda (every GPU) or cuda:I,J,... (GPU indices; repeat one to share it)"));
  }
  std::vector<int> gpus;
  if (spec != "cuda") {
    for (absl::string_view part : absl::StrSplit(spec.substr(5), ',')) {
      int g = -1;
      if (!absl::SimpleAtoi(part, &g) || g < 0 || g > 1023) {
        return absl::InvalidArgumentError(
            absl::StrCat("devices '", spec, "': '", std::string(part), "' is not a GPU index"));
      }
      gpus.push_back(g);
    }
    if (gpus.size() > 64) return absl::InvalidArgumentError(absl::StrCat("devices '", spec, "': at most 64 workers"));
  }
  const int visible = VisibleCudaDevices();
  if (visible == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "devices '", spec, "': no CUDA GPU is visible (no driver, no device or CUDA_VISIBLE_DEVICES); use cpu:N"));
  }
  if (spec == "cuda") {
    for (int g = 0; g < visible; ++g) gpus.push_back(g);
  }
  for (int g : gpus) {
    if (g >= visible) {
      return absl::FailedPreconditionError(
          absl::StrCat("devices '", spec, "': GPU ", g, " is not visible (", visible, " GPU(s) visible)"));
    }
  }
  std::map<int, int> count, seen;
  for (int g : gpus) ++count[g];
  auto arena = PinnedArena::Create(CudaPinnedSlabs(), options.pinned_slab_bytes);
  for (size_t i = 0; i < gpus.size(); ++i) {
    const int g = gpus[i];
    const int k = seen[g]++;
    std::string name = count[g] > 1 ? absl::StrCat("cuda:", g, ".", k) : absl::StrCat("cuda:", g);
    out.push_back(std::make_unique<CudaDevice>(static_cast<int>(i), g, std::move(name), arena, options, timeline));
  }
  return out;
}

}  // namespace rp::workers
