// The facade forwards to the runtime (scheduler/runtime/engine_impl.h); value types only here.
#include "scheduler/engine.h"

#include <dlfcn.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include "scheduler/runtime/engine_impl.h"
#include "scheduler/runtime/model_adapter.h"
#include "workers/optim/cpu_adamw.h"

namespace rp::scheduler {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  auto impl = Impl::Create(options);
  if (!impl.ok()) return impl.status();
  return std::unique_ptr<Engine>(new Engine(std::move(*impl)));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

absl::StatusOr<JobId> Engine::Submit(const JobSpec& spec) { return impl_->Submit(spec); }
absl::Status Engine::FeedBatch(JobId id, Batch batch, std::chrono::milliseconds timeout) {
  return impl_->FeedBatch(id, std::move(batch), timeout);
}
absl::Status Engine::FeedBatchAsync(JobId id, Batch batch, std::function<void(absl::Status)> done) {
  return impl_->FeedBatchAsync(id, std::move(batch), std::move(done));
}
absl::Status Engine::CloseInput(JobId id) { return impl_->CloseInput(id); }
absl::Status Engine::EndWaitingFeeds(JobId id, const absl::Status& why) { return impl_->EndWaitingFeeds(id, why); }
absl::StatusOr<std::vector<JobEvent>> Engine::AwaitEvents(JobId id, std::chrono::milliseconds timeout) {
  return impl_->AwaitEvents(id, timeout);
}
absl::Status Engine::Cancel(JobId id) { return impl_->Cancel(id); }
absl::Status Engine::Pause(JobId id) { return impl_->Pause(id); }
absl::Status Engine::Resume(JobId id) { return impl_->Resume(id); }
absl::StatusOr<JobInfo> Engine::Info(JobId id) const { return impl_->Info(id); }
absl::StatusOr<JobState> Engine::State(JobId id) const {
  auto info = impl_->Info(id);
  if (!info.ok()) return info.status();
  return info->state;
}
absl::StatusOr<spec::ModelConfig> Engine::ModelConfig(JobId id) const { return impl_->ModelConfig(id); }
absl::StatusOr<std::vector<ParameterShape>> Engine::ParameterShapes(JobId id) const {
  return impl_->ParameterShapes(id);
}
absl::StatusOr<TensorValue> Engine::Parameter(JobId id, const std::string& name) const {
  return impl_->Parameter(id, name);
}
absl::StatusOr<CheckpointInfo> Engine::Checkpoint(JobId id, const std::string& note) {
  return impl_->Checkpoint(id, note);
}
absl::StatusOr<int64_t> Engine::Export(JobId id, const std::string& dir, ExportKind kind, const StopCheck& stop) {
  return impl_->Export(id, dir, kind, stop);
}
absl::StatusOr<std::vector<GeneratedSample>> Engine::Generate(const JobSpec& spec, const EvalPolicy::Samples& request,
                                                              const StopCheck& stop) {
  return impl_->Generate(spec, request, stop);
}
EngineStats Engine::Stats() const { return impl_->Stats(); }
absl::Status Engine::DrainWorker(int worker, bool now) { return impl_->DrainWorker(worker, now); }
absl::Status Engine::EnableWorker(int worker) { return impl_->EnableWorker(worker); }

std::vector<OpRecord> Engine::Timeline(double since_s) const {
  std::vector<OpRecord> out;
  for (const workers::TimelineEntry& e : impl_->timeline().EntriesEndingSince(since_s)) {
    out.push_back({e.worker, e.stream, e.label, e.iteration, e.slot, e.microbatch, e.start_s, e.end_s});
  }
  return out;
}
std::string Engine::ChromeTrace() const { return impl_->timeline().ChromeTrace(); }
void Engine::Shutdown() { impl_->Shutdown(); }

int VisibleCudaDevices() { return workers::VisibleCudaDevices(); }

BuildInfo EngineBuildInfo() {
  BuildInfo b;
  b.torch_version = TORCH_VERSION;
  b.torch_cuda_built = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD) != nullptr;
  b.cuda_device_count = static_cast<int>(torch::cuda::device_count());
  b.cpu_optimizer_path = workers::BestSimdPathName();
  return b;
}

}  // namespace rp::scheduler
