#include "client/client.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace rp::client {

namespace v1 = roundpipe::v1;

namespace {
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

absl::Status FromGrpc(const grpc::Status& st) {
  if (st.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
}

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(const std::string& json) {
  v1::JobSpec spec;
  auto st = google::protobuf::util::JsonStringToMessage(json, &spec);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("job spec: ", std::string(st.message())));
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  auto spec = ParseJobSpecJson(*text);
  if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", spec.status().message()));
  return spec;
}

absl::StatusOr<v1::SamplePolicy> LoadSamplingFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  v1::SamplePolicy sampling;
  if (auto st = google::protobuf::util::JsonStringToMessage(*text, &sampling); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a SamplePolicy in JSON: ", std::string(st.message())));
  }
  return sampling;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& o) {
  std::unique_ptr<Client> c(new Client(o));
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (!o.tls_ca_file.empty()) {
    grpc::SslCredentialsOptions so;
    auto ca = ReadFile(o.tls_ca_file);
    if (!ca.ok()) return ca.status();
    so.pem_root_certs = *ca;
    if (!o.tls_cert_file.empty()) {
      auto cert = ReadFile(o.tls_cert_file);
      auto key = ReadFile(o.tls_key_file);
      if (!cert.ok()) return cert.status();
      if (!key.ok()) return key.status();
      so.pem_cert_chain = *cert;
      so.pem_private_key = *key;
    }
    creds = grpc::SslCredentials(so);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(o.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(o.max_message_bytes));
  if (!o.tls_server_name.empty()) args.SetSslTargetNameOverride(o.tls_server_name);
  c->channel_ = grpc::CreateCustomChannel(o.address, creds, args);
  c->jobs_ = v1::JobService::NewStub(c->channel_);
  c->admin_ = v1::AdminService::NewStub(c->channel_);
  return c;
}

void Client::Prepare(grpc::ClientContext* ctx) const {
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
}

#define RP_UNARY(stub, method, req, Resp)           \
  grpc::ClientContext ctx;                          \
  Prepare(&ctx);                                    \
  Resp resp;                                        \
  grpc::Status st = stub->method(&ctx, req, &resp); \
  if (!st.ok()) return FromGrpc(st);

absl::StatusOr<v1::Job> Client::Submit(const v1::JobSpec& spec) {
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  RP_UNARY(jobs_, SubmitJob, req, v1::Job);
  return resp;
}

absl::StatusOr<v1::Job> Client::Get(const std::string& id) {
  v1::GetJobRequest req;
  req.set_job_id(id);
  RP_UNARY(jobs_, GetJob, req, v1::Job);
  return resp;
}

absl::StatusOr<std::vector<v1::Job>> Client::List(const std::vector<v1::JobState>& states) {
  std::vector<v1::Job> out;
  std::string token;
  do {
    v1::ListJobsRequest req;
    for (auto s : states) req.add_states(s);
    req.set_page_token(token);
    RP_UNARY(jobs_, ListJobs, req, v1::ListJobsResponse);
    for (const auto& j : resp.jobs()) out.push_back(j);
    token = resp.next_page_token();
  } while (!token.empty());
  return out;
}

absl::StatusOr<v1::Job> Client::Cancel(const std::string& id) {
  v1::CancelJobRequest req;
  req.set_job_id(id);
  RP_UNARY(jobs_, CancelJob, req, v1::Job);
  return resp;
}

absl::StatusOr<v1::Job> Client::Pause(const std::string& id) {
  v1::PauseJobRequest req;
  req.set_job_id(id);
  RP_UNARY(jobs_, PauseJob, req, v1::Job);
  return resp;
}

absl::StatusOr<v1::Job> Client::Resume(const std::string& id, int nodes) {
  v1::ResumeJobRequest req;
  req.set_nodes(nodes);
  req.set_job_id(id);
  RP_UNARY(jobs_, ResumeJob, req, v1::Job);
  return resp;
}

absl::StatusOr<v1::CheckpointResponse> Client::Checkpoint(const std::string& id) {
  v1::CheckpointRequest req;
  req.set_job_id(id);
  RP_UNARY(jobs_, Checkpoint, req, v1::CheckpointResponse);
  return resp;
}

absl::StatusOr<v1::GenerateResponse> Client::Generate(const std::string& id, const v1::SamplePolicy& sampling) {
  v1::GenerateRequest req;
  req.set_job_id(id);
  *req.mutable_sampling() = sampling;
  RP_UNARY(jobs_, Generate, req, v1::GenerateResponse);
  return resp;
}

absl::StatusOr<std::string> Client::Export(const std::string& id, const std::string& dir, bool merge_lora) {
  v1::ExportModelRequest req;
  req.set_job_id(id);
  req.set_output_dir(dir);
  req.set_merge_lora(merge_lora);
  RP_UNARY(jobs_, ExportModel, req, v1::ExportModelResponse);
  return resp.path();
}

absl::StatusOr<v1::ServerInfo> Client::Info() {
  v1::GetServerInfoRequest req;
  RP_UNARY(admin_, GetServerInfo, req, v1::ServerInfo);
  return resp;
}

absl::StatusOr<int> Client::Drain(int64_t deadline_seconds) {
  v1::DrainRequest req;
  req.set_deadline_seconds(deadline_seconds);
  RP_UNARY(admin_, Drain, req, v1::DrainResponse);
  return resp.jobs_paused();
}

absl::StatusOr<v1::DeviceInfo> Client::DrainWorker(int worker, bool now) {
  v1::WorkerRequest req;
  req.set_worker(worker);
  req.set_now(now);
  RP_UNARY(admin_, DrainWorker, req, v1::DeviceInfo);
  return resp;
}

absl::StatusOr<v1::DeviceInfo> Client::EnableWorker(int worker) {
  v1::WorkerRequest req;
  req.set_worker(worker);
  RP_UNARY(admin_, EnableWorker, req, v1::DeviceInfo);
  return resp;
}

#undef RP_UNARY

absl::StatusOr<v1::StreamSummary> Client::StreamTokens(const std::string& id, const std::vector<int32_t>& tokens,
                                                       int batch, int sequence, bool keep_open,
                                                       const std::function<void(int64_t)>& on_batch) {
  if (batch < 1 || sequence < 1) return absl::InvalidArgumentError("stream: batch and sequence must be >= 1");
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::StreamSummary summary;
  auto writer = jobs_->StreamBatches(&ctx, &summary);
  const size_t per = static_cast<size_t>(batch) * static_cast<size_t>(sequence);
  int64_t i = 0;
  for (size_t off = 0; off + per <= tokens.size(); off += per, ++i) {
    v1::Batch b;
    if (i == 0) {
      b.set_job_id(id);
      b.set_keep_open(keep_open);
    }
    b.set_batch(batch);
    b.set_sequence(sequence);
    b.mutable_tokens()->Add(tokens.begin() + static_cast<std::ptrdiff_t>(off),
                            tokens.begin() + static_cast<std::ptrdiff_t>(off + per));
    if (!writer->Write(b)) break;  // the daemon ended the stream: Finish() says why
    if (on_batch) on_batch(i);
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!st.ok()) return FromGrpc(st);
  return summary;
}

absl::StatusOr<v1::StreamSummary> Client::StreamBatches(const std::string& id, const std::vector<v1::Batch>& batches) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::StreamSummary summary;
  auto writer = jobs_->StreamBatches(&ctx, &summary);
  for (size_t i = 0; i < batches.size(); ++i) {
    v1::Batch b = batches[i];
    if (i == 0 && b.job_id().empty()) b.set_job_id(id);
    if (!writer->Write(b)) break;
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!st.ok()) return FromGrpc(st);
  return summary;
}

absl::Status Client::Watch(const std::string& id, const std::function<void(const v1::JobEvent&)>& on_event,
                           grpc::ClientContext* context) {
  grpc::ClientContext own;
  grpc::ClientContext* ctx = context ? context : &own;
  Prepare(ctx);
  v1::WatchJobRequest req;
  req.set_job_id(id);
  auto reader = jobs_->WatchJob(ctx, req);
  v1::JobEvent e;
  while (reader->Read(&e)) on_event(e);
  return FromGrpc(reader->Finish());
}

}  // namespace rp::client
