// roundpiped — the RoundPipe training daemon. Wiring only: config -> job store -> metrics ->
// engine -> job manager -> gRPC services; then serve until SIGTERM/SIGINT, which drains.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/engine.h"
#include "scheduler/job_files.h"
#include "server/admin_service.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/host_memory.h"
#include "server/job_manager.h"
#include "server/job_service.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/process/thread_stack_floor.h"
#include "server/rpc_metrics.h"

ABSL_FLAG(std::string, config, "", "DaemonConfig JSON file (proto/roundpipe/v1/config.proto); flags override it");
ABSL_FLAG(std::vector<std::string>, listen, {},
          "gRPC listen addresses, comma separated: host:port (port 0 = any free port) or unix:PATH");
ABSL_FLAG(std::string, state_dir, "", "state directory (job store, job outputs); default /var/lib/roundpipe");
ABSL_FLAG(std::string, metrics_address, "-", "Prometheus /metrics address host:port; empty disables; '-' = config");
ABSL_FLAG(std::string, devices, "",
          "devices the daemon owns: auto (every GPU, else one CPU worker; the default), cpu:N, cuda (every GPU) or "
          "cuda:I,J,...");
ABSL_FLAG(std::vector<std::string>, allowed_root, {}, "directories client-named paths must resolve into");
ABSL_FLAG(std::string, log_level, "", "trace, debug, info, warn or error");
ABSL_FLAG(bool, validate_config, false, "check the configuration, print the effective config and exit (0 = valid)");
ABSL_FLAG(std::string, ready_file, "", "once serving, write the bound addresses here as JSON (for scripts and tests)");

namespace v1 = roundpipe::v1;

namespace {

int Fail(const std::string& msg, int code = 1) {
  std::fprintf(stderr, "roundpiped: %s\n", msg.c_str());
  return code;
}

std::shared_ptr<grpc::ServerCredentials> TcpCredentials(const v1::DaemonConfig& c) {
  if (c.tls().cert_file().empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(c.tls().client_ca_file().empty()
                                          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_key_cert_pairs.push_back(
      {*rp::server::ReadWholeFile(c.tls().key_file()), *rp::server::ReadWholeFile(c.tls().cert_file())});
  if (!c.tls().client_ca_file().empty()) o.pem_root_certs = *rp::server::ReadWholeFile(c.tls().client_ca_file());
  return grpc::SslServerCredentials(o);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "roundpiped: the RoundPipe training daemon.\n"
      "  roundpiped --config /etc/roundpipe/roundpiped.json\n"
      "  roundpiped --state_dir /tmp/rp --listen 127.0.0.1:0 --devices cpu:2 --allowed_root /data\n"
      "SIGTERM/SIGINT drain: no new jobs, running jobs pause at an iteration boundary, then exit.");
  absl::ParseCommandLine(argc, argv);
  if (!rp::process::ThreadStackFloorActive()) return Fail("thread stack floor interposer not linked (build bug)");

  // Configuration: file, then flags, then defaults.
  v1::DaemonConfig config;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    auto c = rp::server::LoadConfigFile(absl::GetFlag(FLAGS_config));
    if (!c.ok()) return Fail(std::string(c.status().message()), 2);
    config = *c;
  }
  if (!absl::GetFlag(FLAGS_listen).empty()) {
    config.clear_listen();
    for (const auto& l : absl::GetFlag(FLAGS_listen)) config.add_listen(l);
  }
  if (!absl::GetFlag(FLAGS_state_dir).empty()) config.set_state_dir(absl::GetFlag(FLAGS_state_dir));
  if (absl::GetFlag(FLAGS_metrics_address) != "-")
    config.set_metrics_address(absl::GetFlag(FLAGS_metrics_address));
  else if (absl::GetFlag(FLAGS_config).empty())
    config.set_metrics_address("127.0.0.1:9464");
  if (!absl::GetFlag(FLAGS_devices).empty()) config.set_devices(absl::GetFlag(FLAGS_devices));
  for (const auto& r : absl::GetFlag(FLAGS_allowed_root)) config.add_allowed_roots(r);
  if (!absl::GetFlag(FLAGS_log_level).empty()) config.set_log_level(absl::GetFlag(FLAGS_log_level));
  rp::server::ApplyDefaults(&config);
  if (absl::Status st = rp::server::ValidateConfig(config); !st.ok()) return Fail(std::string(st.message()), 2);
  if (absl::GetFlag(FLAGS_validate_config)) {
    std::string json;
    google::protobuf::util::JsonPrintOptions jo;
    jo.add_whitespace = true;
    (void)google::protobuf::util::MessageToJsonString(config, &json, jo);
    std::printf("config OK\n%s", json.c_str());
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level()));
  spdlog::set_default_logger(spdlog::default_logger()->clone("roundpiped"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");

  // Signals are taken by sigwait below: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::error_code ec;
  const std::filesystem::path state_dir = config.state_dir();
  std::filesystem::create_directories(state_dir / "jobs", ec);
  if (ec) return Fail(absl::StrCat("state_dir ", state_dir.string(), ": ", ec.message()));
  const std::string jobs_dir = std::filesystem::canonical(state_dir / "jobs", ec).string();
  if (ec) return Fail(absl::StrCat("state_dir ", state_dir.string(), "/jobs: ", ec.message()));
  {
    // From here on every file the engine reads, writes, renames or deletes for a job is opened
    // beneath these directories at the moment of use (scheduler/job_files.h).
    std::vector<std::string> confine(config.allowed_roots().begin(), config.allowed_roots().end());
    confine.push_back(jobs_dir);
    if (absl::Status st = rp::scheduler::ConfineFileAccess(confine); !st.ok()) {
      return Fail(absl::StrCat("allowed_roots: ", st.message()), 2);
    }
  }
  auto tokens = rp::server::ReadTokenFiles(config);
  if (!tokens.ok()) return Fail(std::string(tokens.status().message()), 2);
  rp::server::Authenticator auth(*tokens);

  const std::string store_path = (state_dir / "jobs.sqlite").string();
  auto store = rp::server::JobStore::Open(store_path);
  if (!store.ok() && std::filesystem::exists(store_path, ec)) {
    // A store that is not a database any more must not keep the daemon down (a crash loop under
    // systemd): keep it for inspection, start a new one; job ids continue after <state_dir>/jobs.
    const std::string aside = absl::StrCat(store_path, ".damaged-", static_cast<long long>(time(nullptr)));
    spdlog::error("job store {}: {}; moved it to {} and starting with an empty store", store_path,
                  std::string(store.status().message()), aside);
    for (const char* suffix : {"", "-wal", "-shm"}) {
      std::filesystem::rename(store_path + suffix, aside + suffix, ec);
    }
    store = rp::server::JobStore::Open(store_path);
  }
  if (!store.ok()) return Fail(std::string(store.status().message()));

  auto registry = std::make_shared<prometheus::Registry>();
  rp::server::DaemonMetrics metrics(*registry);
  metrics.build_info.Add({{"version", RP_VERSION}, {"torch", rp::server::CollectBuildInfo().torch_version()}}).Set(1);
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string metrics_bound;
  if (!config.metrics_address().empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(config.metrics_address());
    } catch (const std::exception& e) {
      return Fail(absl::StrCat("metrics_address ", config.metrics_address(), ": ", e.what()));
    }
    exposer->RegisterCollectable(registry);
    const auto ports = exposer->GetListeningPorts();
    const std::string host = config.metrics_address().substr(0, config.metrics_address().rfind(':'));
    metrics_bound = absl::StrCat(host, ":", ports.empty() ? 0 : ports.front());
  }

  if (config.devices() == "auto") {
    const int gpus = rp::scheduler::VisibleCudaDevices();
    config.set_devices(gpus > 0 ? "cuda" : "cpu:1");
    spdlog::info("devices=auto: {} GPU(s) visible, using {}", gpus, config.devices());
  }
  auto engine = rp::scheduler::Engine::Create({config.devices()});
  if (!engine.ok()) return Fail(std::string(engine.status().message()), 2);

  rp::server::JobManagerOptions mo;
  mo.jobs_dir = jobs_dir;
  mo.spec.daemon_devices = config.devices();
  mo.spec.num_devices = static_cast<int>((*engine)->Stats().devices.size());
  mo.spec.allowed_roots.assign(config.allowed_roots().begin(), config.allowed_roots().end());
  mo.spec.max_queued_batches = config.max_queued_batches();
  // Jobs run one at a time and a job's store exists only while it runs: a new job fits if it fits
  // in what is available now plus what the running job gives back when it ends.
  mo.spec.host_memory_budget = [e = engine->get()] {
    return rp::server::HostMemoryBudgetNow() + e->Stats().host_model_bytes / 4 * 3;
  };
  mo.spec.max_message_bytes = config.max_message_bytes();
  auto manager = rp::server::JobManager::Create(engine->get(), store->get(), &metrics, mo);
  if (!manager.ok()) return Fail(std::string(manager.status().message()));

  rp::server::JobServiceImpl job_service(manager->get(), &auth);
  rp::server::AdminServiceImpl admin_service(engine->get(), manager->get(), &auth, config.drain_deadline_seconds());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes()));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes()));
  // Backpressure must reach the client: without BDP probing each stream's HTTP/2 window stays
  // at its default (64 KiB), so a fast StreamBatches client cannot park megabytes of batches in
  // the daemon's transport buffers while its job trains (measured: daemon_load_bench).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  std::vector<int> ports(static_cast<size_t>(config.listen_size()), 0);
  for (int i = 0; i < config.listen_size(); ++i) {
    const std::string& a = config.listen(i);
    if (absl::StartsWith(a, "unix:")) {
      std::filesystem::remove(a.substr(5), ec);  // a stale socket from a previous run
      builder.AddListeningPort(a, grpc::InsecureServerCredentials());
    } else {
      builder.AddListeningPort(a, TcpCredentials(config), &ports[static_cast<size_t>(i)]);
    }
  }
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(rp::server::MakeRpcMetricsInterceptorFactory(&metrics));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(&job_service);
  builder.RegisterService(&admin_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return Fail(absl::StrCat("cannot listen on ", absl::StrJoin(config.listen(), ", ")));
  std::vector<std::string> bound;
  for (int i = 0; i < config.listen_size(); ++i) {
    const std::string& a = config.listen(i);
    if (absl::StartsWith(a, "unix:")) {
      chmod(a.substr(5).c_str(), 0660);  // the socket's group decides who may talk to the daemon
      bound.push_back(a);
    } else {
      bound.push_back(absl::StrCat(a.substr(0, a.rfind(':')), ":", ports[static_cast<size_t>(i)]));
    }
  }
  server->GetHealthCheckService()->SetServingStatus(true);

  const std::string status_line =
      absl::StrCat("serving grpc=", absl::StrJoin(bound, ","),
                   " metrics=", metrics_bound.empty() ? "off" : metrics_bound, " devices=", config.devices());
  spdlog::info("roundpiped {}: {}", RP_VERSION, status_line);
  std::printf("roundpiped: %s\n", status_line.c_str());
  std::fflush(stdout);
  if (!absl::GetFlag(FLAGS_ready_file).empty()) {
    const std::string tmp = absl::GetFlag(FLAGS_ready_file) + ".tmp";
    {
      std::ofstream out(tmp);
      out << "{\"grpc\": [";
      for (size_t i = 0; i < bound.size(); ++i) out << (i ? ", " : "") << '"' << bound[i] << '"';
      out << "], \"metrics\": \"" << metrics_bound << "\"}\n";
    }
    std::filesystem::rename(tmp, absl::GetFlag(FLAGS_ready_file), ec);
  }
  sd_notifyf(0, "READY=1\nSTATUS=%s", status_line.c_str());

  // systemd watchdog: ping at half the interval while the process is healthy.
  std::atomic<bool> stopping{false};
  std::thread watchdog;
  uint64_t watchdog_usec = 0;
  if (sd_watchdog_enabled(0, &watchdog_usec) > 0) {
    watchdog = std::thread([&] {
      while (!stopping.load()) {
        sd_notify(0, "WATCHDOG=1");
        for (uint64_t waited = 0; waited < watchdog_usec / 2 && !stopping.load(); waited += 100000) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
    });
  }

  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("received {}: draining (deadline {} s)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               config.drain_deadline_seconds());
  sd_notify(0, "STOPPING=1\nSTATUS=draining");
  server->GetHealthCheckService()->SetServingStatus(false);
  const int paused = (*manager)->Drain(std::chrono::seconds(config.drain_deadline_seconds()));
  (*manager)->Shutdown();  // ends watch streams and feeders, so in-flight RPCs can complete
  spdlog::debug("job manager stopped; stopping the gRPC server");
  // Streams were ended above; the grace only covers unary calls in flight (an idle client
  // connection would otherwise hold Shutdown for the whole deadline).
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  spdlog::debug("gRPC server stopped");
  stopping = true;
  if (watchdog.joinable()) watchdog.join();
  (*engine)->Shutdown();
  spdlog::info("stopped ({} job(s) paused)", paused);
  return 0;
}
