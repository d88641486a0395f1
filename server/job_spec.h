// job_spec.h — turns a client's roundpipe.v1.JobSpec into the engine's JobSpec plus what the
// server keeps for itself (data source, sizes, output dir). Every rule a spec must satisfy is
// checked here, with a message that names the field and says what to fix.
//
// Contract: pure functions (they stat the paths a spec names), any thread.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "roundpipe/v1/jobs.pb.h"
#include "scheduler/engine_types.h"

namespace rp::server {

struct JobSpecContext {
  std::string daemon_devices;  // e.g. "cpu:2"
  int num_devices = 1;
  std::vector<std::string> allowed_roots;
  std::string default_output_dir;  // used when the spec names none
  int max_queued_batches = 8;
  // Bytes a new job's host model state may take, asked at each admission; empty = unchecked.
  std::function<int64_t()> host_memory_budget;
  int64_t max_message_bytes = 0;  // the daemon's gRPC message limit (streamed batches must fit); 0 = unchecked
  int nodes = 1;                  // a cluster job's node: its micro-batches are its share of the global batch
};

struct ResolvedJob {
  scheduler::JobSpec engine;  // engine.token_file set: the engine reads the data itself
  int64_t global_batch = 0;   // sequences per step
  int64_t sequence_length = 0;
  bool streamed() const { return !engine.token_file; }
  std::string output_dir;  // resolved
};

// Model presets (jobs.proto ModelSpec.preset) are the planner's registry:
// planning::ModelPreset / ModelPresetNames (scheduler/planning/presets.h).

// A SamplePolicy as the engine takes it (max_new_tokens 0 = 32); unchecked.
scheduler::EvalPolicy::Samples ToSamples(const roundpipe::v1::SamplePolicy& p);

absl::StatusOr<ResolvedJob> ResolveJobSpec(const roundpipe::v1::JobSpec& spec, const JobSpecContext& ctx);

// InvalidArgument naming the first double/float field (dotted path, repeated ones included) of
// `msg` that is NaN or infinite.
absl::Status CheckFiniteNumbers(const google::protobuf::Message& msg, const std::string& prefix);

}  // namespace rp::server
