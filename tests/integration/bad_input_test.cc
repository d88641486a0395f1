// The bad-input matrix against the real daemon: every malformed request gets the right gRPC code
// and a message that says what to fix; the daemon keeps serving and a job running alongside is
// untouched. Then access control: bearer tokens and a TLS-only listener.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/integration/fixtures.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;
using absl::StatusCode;

void ExpectError(const absl::Status& st, StatusCode code, const std::string& needle, const std::string& what) {
  EXPECT_EQ(st.code(), code) << what << ": " << st;
  EXPECT_NE(st.message().find(needle), std::string::npos)
      << what << ": '" << st.message() << "' lacks '" << needle << "'";
}

v1::Batch GoodBatch(const std::string& job, uint32_t seed) {
  v1::Batch b;
  b.set_job_id(job);
  b.set_batch(4);
  b.set_sequence(16);
  for (int32_t t : DaemonTest::SomeTokens(64, seed)) b.add_tokens(t);
  return b;
}

TEST_F(DaemonTest, BadInputMatrixGetsClearErrorsAndTheDaemonAndOtherJobsCarryOn) {
  // A small message limit so "oversized" is cheap to provoke.
  const std::string config = root_ + "/daemon.json";
  std::ofstream(config) << R"({"maxMessageBytes": 65536, "maxQueuedBatches": 2})";
  ASSERT_TRUE(StartDaemon({"--config", config}));
  auto c = daemon_.Connect();

  // A healthy streamed job that must be unaffected by everything below.
  v1::JobSpec spec = TinySpec();
  auto healthy = c->Submit(spec);
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  Watcher w(*c, healthy->id());
  ASSERT_TRUE(c->StreamBatches(healthy->id(), {GoodBatch("", 1)}).ok());  // closes its input...
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
  // ...so use a second, long-lived one (keep_open) as the bystander.
  auto bystander = c->Submit(spec);
  ASSERT_TRUE(bystander.ok());
  Watcher wb(*c, bystander->id());
  v1::Batch first = GoodBatch(bystander->id(), 2);
  first.set_keep_open(true);
  ASSERT_TRUE(c->StreamBatches(bystander->id(), {first}).ok());
  ASSERT_TRUE(wb.WaitForSteps(1));

  // --- job specs ---
  struct SpecCase {
    std::string what;
    std::function<void(v1::JobSpec&)> mutate;
    StatusCode code;
    std::string needle;
  };
  const std::vector<SpecCase> specs = {
      {"unknown preset",
       [](auto& s) {
         s.clear_model();
         s.mutable_model()->set_preset("llama-99b");
       },
       StatusCode::kInvalidArgument, "unknown preset 'llama-99b'"},
      {"negative size", [](auto& s) { s.mutable_model()->set_hidden(-32); }, StatusCode::kInvalidArgument,
       "model.hidden"},
      {"inconsistent heads", [](auto& s) { s.mutable_model()->set_num_kv_heads(3); }, StatusCode::kInvalidArgument,
       "model"},
      {"batch vs micro-batch", [](auto& s) { s.mutable_batching()->set_micro_batch(3); }, StatusCode::kInvalidArgument,
       "multiple of micro_batch"},
      {"token file outside roots", [](auto& s) { s.mutable_data()->mutable_token_file()->set_path("/etc/passwd"); },
       StatusCode::kPermissionDenied, "outside the allowed roots"},
      {"token file via ..",
       [this](auto& s) { s.mutable_data()->mutable_token_file()->set_path(root_ + "/data/../daemon.json"); },
       StatusCode::kPermissionDenied, "outside the allowed roots"},
      {"token file via symlink",
       [this](auto& s) {
         std::filesystem::create_symlink("/etc", root_ + "/data/etc-link");
         s.mutable_data()->mutable_token_file()->set_path(root_ + "/data/etc-link/passwd");
       },
       StatusCode::kPermissionDenied, "outside the allowed roots"},
      {"jsonl tokenizer outside roots",
       [this](auto& s) {
         s.mutable_data()->mutable_token_file()->set_path(root_ + "/data/x.jsonl");
         s.mutable_data()->mutable_token_file()->set_tokenizer_dir("/etc");
       },
       StatusCode::kPermissionDenied, "data.token_file.tokenizer_dir"},
      {"jsonl without a tokenizer",
       [this](auto& s) {
         std::ofstream(root_ + "/data/x.jsonl") << "{\"text\": \"hi\"}\n";
         s.mutable_data()->mutable_token_file()->set_path(root_ + "/data/x.jsonl");
       },
       StatusCode::kInvalidArgument, "needs a tokenizer"},
      {"jsonl tokenizer dir without tokenizer.json",
       [this](auto& s) {
         std::ofstream(root_ + "/data/x.jsonl") << "{\"text\": \"hi\"}\n";
         s.mutable_data()->mutable_token_file()->set_path(root_ + "/data/x.jsonl");
         s.mutable_data()->mutable_token_file()->set_tokenizer_dir(root_ + "/data");
       },
       StatusCode::kInvalidArgument, "tokenizer.json"},
      {"missing token file",
       [this](auto& s) { s.mutable_data()->mutable_token_file()->set_path(root_ + "/data/nothing.bin"); },
       StatusCode::kInvalidArgument, "nothing.bin"},
      {"output dir outside", [](auto& s) { s.set_output_dir("/tmp/../etc/x"); }, StatusCode::kPermissionDenied,
       "output_dir"},
      {"document masks on a flat token file",
       [this](auto& s) {
         s.mutable_data()->mutable_token_file()->set_path(TokenFile(4000));
         s.mutable_data()->mutable_token_file()->set_packing(v1::DataSource::TokenFile::PACKING_DOCUMENT_MASKED);
       },
       StatusCode::kInvalidArgument, "data.token_file: packing: document masks need a dataset"},
      {"unknown packing",
       [this](auto& s) {
         s.mutable_data()->mutable_token_file()->set_path(TokenFile(4000));
         s.mutable_data()->mutable_token_file()->set_packing(static_cast<v1::DataSource::TokenFile::Packing>(9));
       },
       StatusCode::kInvalidArgument, "data.token_file.packing: unknown value 9"},
      {"eval without validation data", [](auto& s) { s.mutable_eval()->set_every_steps(10); },
       StatusCode::kInvalidArgument, "eval: needs validation data (data.validation)"},
      {"negative eval interval",
       [this](auto& s) {
         s.mutable_data()->mutable_validation()->set_path(TokenFile(4000));
         s.mutable_eval()->set_every_steps(-1);
       },
       StatusCode::kInvalidArgument, "eval.every_steps"},
      {"validation outside roots", [](auto& s) { s.mutable_data()->mutable_validation()->set_path("/etc/passwd"); },
       StatusCode::kPermissionDenied, "data.validation.path"},
      {"validation smaller than a batch",
       [this](auto& s) { s.mutable_data()->mutable_validation()->set_path(TokenFile(40)); },
       StatusCode::kInvalidArgument, "data.validation: token file"},
      {"more minimum slots than the layers make", [](auto& s) { s.mutable_partition()->set_min_stages(8); },
       StatusCode::kInvalidArgument, "partition.min_stages: 8 is outside 0..7"},
      {"t_max window below 1", [](auto& s) { s.mutable_partition()->set_t_max_window(0.5); },
       StatusCode::kInvalidArgument, "partition.t_max_window: 0.5 must be >= 1"},
      {"router aux loss on a dense model", [](auto& s) { s.mutable_model()->set_router_aux_loss_coef(0.01); },
       StatusCode::kInvalidArgument, "model.router_aux_loss_coef: the model has no experts"},
      {"negative router aux loss", [](auto& s) { s.mutable_model()->set_router_aux_loss_coef(-1); },
       StatusCode::kInvalidArgument, "model.router_aux_loss_coef: must be >= 0"},
      {"partition knobs next to layer counts",
       [](auto& s) {
         s.mutable_partition()->add_forward(2);
         s.mutable_partition()->set_fused(2);
         s.mutable_partition()->add_backward(2);
         s.mutable_partition()->set_min_stages(3);
       },
       StatusCode::kInvalidArgument, "steer the automatic partition"},
  };
  for (const auto& sc : specs) {
    v1::JobSpec s = TinySpec();
    sc.mutate(s);
    ExpectError(c->Submit(s).status(), sc.code, sc.needle, sc.what);
  }
  // A malformed JSON spec is refused by the JSON mapping with the offending field named.
  ExpectError(client::ParseJobSpecJson(R"({"model": {"preset": "llama-tiny"}, "batchSize": 3})").status(),
              StatusCode::kInvalidArgument, "batchSize", "unknown JSON field");
  ExpectError(client::ParseJobSpecJson(R"({"model": )").status(), StatusCode::kInvalidArgument, "job spec",
              "truncated JSON");

  // --- streamed batches ---
  auto stream_one = [&](v1::Batch b) { return c->StreamBatches(b.job_id(), {b}).status(); };
  v1::Batch b = GoodBatch(bystander->id(), 3);
  b.set_keep_open(true);
  b.set_batch(3);
  ExpectError(stream_one(b), StatusCode::kInvalidArgument, "does not match the job's global_batch", "wrong shape");
  b = GoodBatch(bystander->id(), 3);
  b.set_keep_open(true);
  b.mutable_tokens()->RemoveLast();
  ExpectError(stream_one(b), StatusCode::kInvalidArgument, "63 token ids", "wrong length");
  b = GoodBatch(bystander->id(), 3);
  b.set_keep_open(true);
  b.set_tokens(5, 256);
  ExpectError(stream_one(b), StatusCode::kInvalidArgument, "token id 256 at position 5 is outside the vocabulary",
              "token >= vocab");
  b.set_tokens(5, -1);
  ExpectError(stream_one(b), StatusCode::kInvalidArgument, "token id -1", "negative token");
  b = GoodBatch(bystander->id(), 3);
  b.set_keep_open(true);
  b.add_loss_mask(true);
  ExpectError(stream_one(b), StatusCode::kInvalidArgument, "loss_mask", "short loss mask");
  ExpectError(stream_one(GoodBatch("job-424242", 3)), StatusCode::kNotFound, "no job 'job-424242'", "unknown job");
  ExpectError(stream_one(GoodBatch(healthy->id(), 3)), StatusCode::kFailedPrecondition, "accepts no more batches",
              "finished job");
  ExpectError(stream_one(GoodBatch("", 3)), StatusCode::kInvalidArgument, "job_id is required", "no job id");
  ExpectError(c->StreamBatches(bystander->id(), {}).status(), StatusCode::kInvalidArgument, "carried no batch",
              "empty stream");
  v1::Batch huge = GoodBatch(bystander->id(), 3);
  for (int i = 0; i < 40000; ++i) huge.add_tokens(200);  // 2-byte varints: > 64 KiB on the wire
  ExpectError(stream_one(huge), StatusCode::kResourceExhausted, "", "oversized message");
  // A later bad batch in a stream: the earlier ones count, the stream ends with the error.
  {
    v1::Batch ok1 = GoodBatch(bystander->id(), 4), bad = GoodBatch("", 5);
    ok1.set_keep_open(true);
    bad.set_tokens(0, 9999);
    auto st = c->StreamBatches(bystander->id(), {ok1, bad});
    ExpectError(st.status(), StatusCode::kInvalidArgument, "batch #2 of this stream", "bad second batch");
  }
  // A client that disconnects mid-stream: the job keeps its input open and goes on.
  {
    grpc::ClientContext ctx;
    v1::StreamSummary summary;
    auto stub = v1::JobService::NewStub(grpc::CreateChannel(daemon_.address(), grpc::InsecureChannelCredentials()));
    auto writer = stub->StreamBatches(&ctx, &summary);
    v1::Batch one = GoodBatch(bystander->id(), 6);
    ASSERT_TRUE(writer->Write(one));
    ctx.TryCancel();
    EXPECT_FALSE(writer->Finish().ok());
  }
  // Control calls on unknown jobs.
  ExpectError(c->Get("nope").status(), StatusCode::kNotFound, "no job 'nope'", "get unknown");
  ExpectError(c->Cancel("nope").status(), StatusCode::kNotFound, "nope", "cancel unknown");
  ExpectError(c->Export(healthy->id(), "/etc/exported").status(), StatusCode::kPermissionDenied, "output_dir",
              "export outside roots");
  ExpectError(c->Export(bystander->id()).status(), StatusCode::kFailedPrecondition, "pause it first",
              "export while running");

  // The daemon still serves, and the bystander still trains and finishes cleanly.
  ASSERT_TRUE(c->Info().ok());
  const int64_t before = c->Get(bystander->id())->progress().step();
  v1::Batch last = GoodBatch(bystander->id(), 7);
  ASSERT_TRUE(c->StreamBatches(bystander->id(), {last}).ok());  // closes its input
  ASSERT_TRUE(wb.WaitForState(v1::JOB_STATE_SUCCEEDED)) << daemon_.Output();
  EXPECT_GT(c->Get(bystander->id())->progress().step(), before);
  EXPECT_EQ(c->Get(bystander->id())->error(), "");
}

TEST_F(DaemonTest, BearerTokensAreRequiredWhenConfigured) {
  const std::string token = "s3cret-token-0123456789";
  std::ofstream(root_ + "/token") << token << "\n";
  std::ofstream(root_ + "/daemon.json") << R"({"tokenFiles": [")" << root_ << R"(/token"]})";
  ASSERT_TRUE(StartDaemon({"--config", root_ + "/daemon.json"}));
  auto anonymous = daemon_.Connect();
  auto wrong = daemon_.Connect("s3cret-token-0123456780");
  auto good = daemon_.Connect(token);
  ExpectError(anonymous->Info().status(), StatusCode::kUnauthenticated, "bearer token", "no token");
  ExpectError(wrong->Info().status(), StatusCode::kUnauthenticated, "invalid bearer token", "wrong token");
  ExpectError(anonymous->Submit(TinySpec()).status(), StatusCode::kUnauthenticated, "", "submit without token");
  ExpectError(anonymous->Watch("job-000001", [](const auto&) {}), StatusCode::kUnauthenticated, "", "watch");
  ExpectError(anonymous->StreamBatches("job-000001", {GoodBatch("job-000001", 1)}).status(),
              StatusCode::kUnauthenticated, "", "stream");
  ASSERT_TRUE(good->Info().ok());
  auto job = good->Submit(TinySpec());
  ASSERT_TRUE(job.ok()) << job.status();
  // The token never reaches the log.
  EXPECT_EQ(daemon_.Output().find(token), std::string::npos);
}

TEST_F(DaemonTest, TlsListenerRefusesPlaintext) {
  std::string out;
  const std::string key = root_ + "/key.pem", cert = root_ + "/cert.pem";
  ASSERT_EQ(RunCommand("openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -addext "
                       "subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
                           key + " -out " + cert,
                       &out),
            0)
      << "openssl cannot make a test certificate here (deploy/install-deps.sh installs openssl): " << out;
  std::ofstream(root_ + "/daemon.json") << R"({"tls": {"certFile": ")" << cert << R"(", "keyFile": ")" << key
                                        << R"("}})";
  ASSERT_TRUE(StartDaemon({"--config", root_ + "/daemon.json"}));
  client::ClientOptions plain;
  plain.address = daemon_.address();
  auto p = client::Client::Connect(plain);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->Info().status().code(), StatusCode::kUnavailable);
  client::ClientOptions tls = plain;
  tls.tls_ca_file = cert;
  tls.tls_server_name = "localhost";
  auto t = client::Client::Connect(tls);
  ASSERT_TRUE(t.ok());
  auto info = (*t)->Info();
  EXPECT_TRUE(info.ok()) << info.status();
}

TEST(DaemonConfigCheck, RemoteListenerWithoutProtectionIsRefused) {
  std::string out;
  EXPECT_EQ(RunCommand(std::string(RP_ROUNDPIPED) + " --validate_config --listen 0.0.0.0:50151 --state_dir /tmp", &out),
            2)
      << out;
  EXPECT_NE(out.find("not a loopback address"), std::string::npos) << out;
  EXPECT_EQ(RunCommand(std::string(RP_ROUNDPIPED) + " --validate_config --listen 127.0.0.1:0 --state_dir /tmp", &out),
            0)
      << out;
  EXPECT_NE(out.find("config OK"), std::string::npos) << out;
}

}  // namespace
}  // namespace rp::testing
