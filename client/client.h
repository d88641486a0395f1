// client.h — a small C++ client for roundpiped (JobService, AdminService): connection options
// (address, bearer token, TLS), blocking calls that return absl::Status, job-spec JSON files,
// token streaming with backpressure and event watching.
//
// Contract: one Client may be used from several threads (gRPC stubs are thread-safe); every
// call blocks until the daemon answers.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "roundpipe/v1/admin.grpc.pb.h"
#include "roundpipe/v1/jobs.grpc.pb.h"

namespace rp::client {

struct ClientOptions {
  std::string address = "127.0.0.1:50151";  // host:port or unix:PATH
  std::string token;                        // bearer token; empty = none
  std::string tls_ca_file;                  // set: TLS, verifying the daemon against this CA
  std::string tls_cert_file, tls_key_file;  // client certificate (daemons that require one)
  std::string tls_server_name;              // expected name in the daemon's certificate (default: the host)
  int64_t max_message_bytes = int64_t{64} << 20;
};

absl::Status FromGrpc(const grpc::Status& st);

// Parses a JSON job spec (unknown fields are errors).
absl::StatusOr<roundpipe::v1::JobSpec> ParseJobSpecJson(const std::string& json);
absl::StatusOr<roundpipe::v1::JobSpec> LoadJobSpecFile(const std::string& path);
// A SamplePolicy in JSON ({"prompts": [...], "maxNewTokens": ...}), e.g. what
// `roundpipe_client.py chat-prompts` writes (unknown fields are errors).
absl::StatusOr<roundpipe::v1::SamplePolicy> LoadSamplingFile(const std::string& path);

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  absl::StatusOr<roundpipe::v1::Job> Submit(const roundpipe::v1::JobSpec& spec);
  absl::StatusOr<roundpipe::v1::Job> Get(const std::string& job_id);
  absl::StatusOr<std::vector<roundpipe::v1::Job>> List(const std::vector<roundpipe::v1::JobState>& states = {});
  absl::StatusOr<roundpipe::v1::Job> Cancel(const std::string& job_id);
  absl::StatusOr<roundpipe::v1::Job> Pause(const std::string& job_id);
  // `nodes`: a cluster job that failed or was cancelled resumes on this many nodes (0: as before).
  absl::StatusOr<roundpipe::v1::Job> Resume(const std::string& job_id, int nodes = 0);
  absl::StatusOr<roundpipe::v1::CheckpointResponse> Checkpoint(const std::string& job_id);
  absl::StatusOr<std::string> Export(const std::string& job_id, const std::string& output_dir = "",
                                     bool merge_lora = false);
  // Completions from a finished job's final weights (JobService.Generate).
  absl::StatusOr<roundpipe::v1::GenerateResponse> Generate(const std::string& job_id,
                                                           const roundpipe::v1::SamplePolicy& sampling);
  absl::StatusOr<roundpipe::v1::ServerInfo> Info();
  absl::StatusOr<int> Drain(int64_t deadline_seconds = 0);
  // One worker out of the pool (gracefully, or `now`: its slots re-run elsewhere) or back in.
  absl::StatusOr<roundpipe::v1::DeviceInfo> DrainWorker(int worker, bool now);
  absl::StatusOr<roundpipe::v1::DeviceInfo> EnableWorker(int worker);

  // Streams `tokens` as [batch, sequence] batches (consecutive windows; a last partial batch is
  // dropped). Blocks as the daemon applies backpressure. `on_batch(i)` runs after each write.
  absl::StatusOr<roundpipe::v1::StreamSummary> StreamTokens(const std::string& job_id,
                                                            const std::vector<int32_t>& tokens, int batch, int sequence,
                                                            bool keep_open = false,
                                                            const std::function<void(int64_t)>& on_batch = {});
  // Streams prepared Batch messages (job_id is set on the first).
  absl::StatusOr<roundpipe::v1::StreamSummary> StreamBatches(const std::string& job_id,
                                                             const std::vector<roundpipe::v1::Batch>& batches);
  // Calls `on_event` for every event until the job ends (OK) or the stream breaks. Another
  // thread may stop the watch with context->TryCancel() when it passes its own context.
  absl::Status Watch(const std::string& job_id, const std::function<void(const roundpipe::v1::JobEvent&)>& on_event,
                     grpc::ClientContext* context = nullptr);

 private:
  explicit Client(ClientOptions o) : options_(std::move(o)) {}
  void Prepare(grpc::ClientContext* ctx) const;
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<roundpipe::v1::JobService::Stub> jobs_;
  std::unique_ptr<roundpipe::v1::AdminService::Stub> admin_;
};

}  // namespace rp::client
