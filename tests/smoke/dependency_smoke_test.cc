// Day-one smoke test: LibTorch (CPU and CUDA libraries), gRPC + protobuf, spdlog and
// prometheus-cpp linked into one binary and exercised together, with torch's headers on the
// include path of this very translation unit (the fmt/protobuf shadowing case, ARCHITECTURE §7).
#include <ATen/ATen.h>
#include <dlfcn.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <pthread.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <spdlog/version.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <unistd.h>

#include <google/protobuf/stubs/common.h>
#include <memory>
#include <sstream>
#include <string>

#include "server/process/thread_stack_floor.h"
#include "smoke.grpc.pb.h"
#include "tests/support/http_get.h"

namespace {

roundpipe::v1::BuildInfo CollectBuildInfo() {
  roundpipe::v1::BuildInfo info;
  info.set_roundpipe_version("smoke");
  info.set_torch_version(TORCH_VERSION);
  info.set_torch_cuda_built(dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD) != nullptr);
  info.set_cuda_device_count(static_cast<int>(torch::cuda::device_count()));
  info.set_grpc_version(grpc::Version());
  info.set_protobuf_version(GOOGLE_PROTOBUF_VERSION);
  info.set_spdlog_version(SPDLOG_VERSION);
  return info;
}

class EchoService final : public roundpipe::smoke::Echo::CallbackService {
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* ctx, const roundpipe::smoke::EchoRequest* req,
                                 roundpipe::smoke::EchoReply* reply) override {
    // Reduce the payload with LibTorch inside the gRPC handler.
    std::vector<float> v(req->values().begin(), req->values().end());
    at::Tensor t = at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kFloat).clone();
    reply->set_sum(t.sum().item<double>());
    *reply->mutable_info() = req->info();
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

TEST(DependencySmoke, TorchComputesAndAutogradWorks) {
  at::Tensor x = at::arange(6, at::kFloat).reshape({2, 3}).set_requires_grad(true);
  at::Tensor w = at::ones({3, 2}, at::kFloat);
  at::Tensor y = at::matmul(x, w).pow(2).sum();
  y.backward();
  // y = sum_i (2 * rowsum_i)^2 ... d/dx_ij = 2 * (x_i . w_:k summed over k) -> 2 * 2 * rowsum_i
  EXPECT_DOUBLE_EQ(y.item<double>(), (3.0 * 3 * 2) + (12.0 * 12 * 2));
  EXPECT_FLOAT_EQ(x.grad()[0][0].item<float>(), 4.0f * 3.0f);
  EXPECT_FLOAT_EQ(x.grad()[1][2].item<float>(), 4.0f * 12.0f);
}

TEST(DependencySmoke, TorchCudaLibraryIsLinked) {
  roundpipe::v1::BuildInfo info = CollectBuildInfo();
  EXPECT_TRUE(info.torch_cuda_built()) << "libtorch_cuda.so is not loaded: CUDA parts not linked";
  EXPECT_GE(info.cuda_device_count(), 0);
  if (info.cuda_device_count() == 0) {
    GTEST_LOG_(INFO) << "no CUDA device present (expected on CI); CUDA library linked and loaded";
  }
}

TEST(DependencySmoke, GrpcRoundTripCarriesTorchResult) {
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = roundpipe::smoke::Echo::NewStub(channel);
  roundpipe::smoke::EchoRequest req;
  *req.mutable_info() = CollectBuildInfo();
  for (int i = 1; i <= 100; ++i) req.add_values(static_cast<float>(i));
  roundpipe::smoke::EchoReply reply;
  grpc::ClientContext ctx;
  grpc::Status st = stub->Echo(&ctx, req, &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_DOUBLE_EQ(reply.sum(), 5050.0);
  EXPECT_EQ(reply.info().protobuf_version(), GOOGLE_PROTOBUF_VERSION);
  EXPECT_EQ(reply.info().grpc_version(), grpc::Version());
  server->Shutdown();
}

TEST(DependencySmoke, SpdlogFormatsWithDebianFmt) {
  std::ostringstream os;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(os);
  spdlog::logger logger("smoke", sink);
  logger.set_pattern("%v");
  at::Tensor t = at::full({2}, 1.5, at::kFloat);
  logger.info("job={} loss={:.3f} n={}", "j-1", t.sum().item<double>(), t.numel());
  logger.flush();
  EXPECT_EQ(os.str(), "job=j-1 loss=3.000 n=2\n");
}

TEST(DependencySmoke, SmallThreadStacksStillFitTorchTls) {
  // civetweb asks for 100 KiB stacks; with LibTorch's static TLS that fails unless the floor
  // (server/process/thread_stack_floor.h) is in effect.
  ASSERT_TRUE(rp::process::ThreadStackFloorActive());
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 100 * 1024), 0);
  size_t got = 0;
  pthread_attr_getstacksize(&attr, &got);
  EXPECT_GE(got, rp::process::kThreadStackFloorBytes);
  pthread_t t;
  ASSERT_EQ(pthread_create(
                &t, &attr, [](void*) -> void* { return nullptr; }, nullptr),
            0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
}

TEST(DependencySmoke, PrometheusScrapeOnLoopback) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildCounter()
                     .Name("roundpipe_smoke_tokens_total")
                     .Help("Tokens counted by the smoke test")
                     .Register(*registry);
  family.Add({{"worker", "0"}}).Increment(at::ones({7}).sum().item<double>());
  prometheus::Exposer exposer("127.0.0.1:0");  // the kernel picks the port
  exposer.RegisterCollectable(registry);
  auto ports = exposer.GetListeningPorts();
  ASSERT_EQ(ports.size(), 1u);
  ASSERT_GT(ports[0], 0);
  std::string body = rp::testing::HttpGetResponse(ports[0], "/metrics");
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body;
  EXPECT_NE(body.find("roundpipe_smoke_tokens_total{worker=\"0\"} 7"), std::string::npos) << body;
}

}  // namespace
