#include "scheduler/engine_types.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace rp::scheduler {

int PrecisionBytes(Precision p) { return p == Precision::kFloat32 ? 4 : 2; }

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFloat32:
      return "fp32";
    case Precision::kBFloat16:
      return "bf16";
    case Precision::kFloat16:
      return "fp16";
  }
  return "?";
}

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kPaused:
      return "PAUSED";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "?";
}

const char* PlanChangeCauseName(PlanChange::Cause c) {
  switch (c) {
    case PlanChange::Cause::kWorkerLost:
      return "worker lost";
    case PlanChange::Cause::kWorkerDrained:
      return "worker drained";
    case PlanChange::Cause::kWorkerReturned:
      return "worker returned";
    case PlanChange::Cause::kOutOfMemory:
      return "device out of memory";
  }
  return "?";
}

bool IsTerminal(JobState s) { return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled; }

std::vector<int32_t> ShiftedLabels(int64_t rows, int64_t cols, const std::vector<int32_t>& tokens,
                                   const std::vector<bool>& loss_mask) {
  std::vector<int32_t> labels(static_cast<size_t>(rows * cols), Batch::kIgnoreLabel);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c + 1 < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      if (loss_mask.empty() || loss_mask[i]) labels[i] = tokens[i + 1];
    }
  }
  return labels;
}

std::vector<HostPool> HostPools(const EngineStats& s) {
  // The pinned arena is shared by all CUDA workers: any device reports it (zero on CPU).
  return {{"model_states", s.host_model_bytes},
          {"optimizer_state", s.host_optimizer_bytes},
          {"activations", s.host_activation_bytes},
          {"mapped_base", s.host_mapped_bytes - s.host_registered_bytes},
          {"registered_base", s.host_registered_bytes},
          {"pinned", s.devices.empty() ? 0 : s.devices.front().pinned_reserved_bytes}};
}

absl::Status CheckSampleOptions(const EvalPolicy::Samples& s, const std::string& field) {
  if (static_cast<int>(s.prompts.size()) > kMaxSamplePrompts) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".prompts: at most ", kMaxSamplePrompts));
  }
  for (size_t i = 0; i < s.prompts.size(); ++i) {
    if (s.prompts[i].empty() || s.prompts[i].size() > kMaxSamplePromptBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".prompts[", i, "]: 1 to ", kMaxSamplePromptBytes, " bytes of text"));
    }
  }
  if (s.max_new_tokens < 1 || s.max_new_tokens > kMaxSampleNewTokens) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".max_new_tokens: 1 to ", kMaxSampleNewTokens));
  }
  if (!std::isfinite(s.temperature) || s.temperature < 0 || s.temperature > 100) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".temperature: 0 (greedy) to 100"));
  }
  return absl::OkStatus();
}

}  // namespace rp::scheduler
