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
#include <optional>
#include <thread>
#include <variant>

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
#include "server/cluster.h"
#include "server/cluster_service.h"
#include "server/config.h"
#include "server/engine_metrics.h"
#include "server/host_memory.h"
#include "server/job_manager.h"
#include "server/job_service.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/process/heap_policy.h"
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

// A startup step's failure: what to print and the exit code (2: the configuration or the
// command line is wrong; 1: anything else).
struct StartupError {
  std::string message;
  int exit_code = 1;
};
template <typename T>
using Step = std::variant<T, StartupError>;
StartupError ConfigError(std::string msg) { return {std::move(msg), 2}; }
StartupError OtherError(std::string msg) { return {std::move(msg), 1}; }

int Fail(const StartupError& e) {
  std::fprintf(stderr, "roundpiped: %s\n", e.message.c_str());
  return e.exit_code;
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

// Configuration: the file, then the flags, then the defaults; validated.
Step<v1::DaemonConfig> ConfigFromFileAndFlags() {
  v1::DaemonConfig config;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    auto c = rp::server::LoadConfigFile(absl::GetFlag(FLAGS_config));
    if (!c.ok()) return ConfigError(std::string(c.status().message()));
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
  if (absl::Status st = rp::server::ValidateConfig(config); !st.ok()) return ConfigError(std::string(st.message()));
  return config;
}

void PrintEffectiveConfig(const v1::DaemonConfig& config) {
  std::string json;
  google::protobuf::util::JsonPrintOptions jo;
  jo.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(config, &json, jo);
  std::printf("config OK\n%s", json.c_str());
}

// <state_dir>/jobs exists; every file the engine reads, writes, renames or deletes for a job is
// opened beneath the allowed roots and it from now on (scheduler/job_files.h). Returns its
// canonical path.
Step<std::string> PrepareStateDir(const v1::DaemonConfig& config) {
  std::error_code ec;
  const std::filesystem::path state_dir = config.state_dir();
  std::filesystem::create_directories(state_dir / "jobs", ec);
  if (ec) return OtherError(absl::StrCat("state_dir ", state_dir.string(), ": ", ec.message()));
  std::string jobs_dir = std::filesystem::canonical(state_dir / "jobs", ec).string();
  if (ec) return OtherError(absl::StrCat("state_dir ", state_dir.string(), "/jobs: ", ec.message()));
  std::vector<std::string> confine(config.allowed_roots().begin(), config.allowed_roots().end());
  confine.push_back(jobs_dir);
  if (absl::Status st = rp::scheduler::ConfineFileAccess(confine); !st.ok()) {
    return ConfigError(absl::StrCat("allowed_roots: ", st.message()));
  }
  return jobs_dir;
}

// The job store. One that is not a database any more must not keep the daemon down (a crash
// loop under systemd): it is kept for inspection and a new one started; job ids continue after
// <state_dir>/jobs.
Step<std::unique_ptr<rp::server::JobStore>> OpenJobStore(const std::string& store_path) {
  std::error_code ec;
  auto store = rp::server::JobStore::Open(store_path);
  if (!store.ok() && std::filesystem::exists(store_path, ec)) {
    const std::string aside = absl::StrCat(store_path, ".damaged-", static_cast<long long>(time(nullptr)));
    spdlog::error("job store {}: {}; moved it to {} and starting with an empty store", store_path,
                  std::string(store.status().message()), aside);
    for (const char* suffix : {"", "-wal", "-shm"}) {
      std::filesystem::rename(store_path + suffix, aside + suffix, ec);
    }
    store = rp::server::JobStore::Open(store_path);
  }
  if (!store.ok()) return OtherError(std::string(store.status().message()));
  return std::move(*store);
}

struct MetricsEndpoint {
  std::unique_ptr<prometheus::Exposer> exposer;  // null: metrics off
  std::string bound;                             // host:port, empty when off
};
Step<MetricsEndpoint> ServeMetrics(const v1::DaemonConfig& config, std::shared_ptr<prometheus::Registry> registry) {
  MetricsEndpoint m;
  if (config.metrics_address().empty()) return m;
  try {
    m.exposer = std::make_unique<prometheus::Exposer>(config.metrics_address());
  } catch (const std::exception& e) {
    return OtherError(absl::StrCat("metrics_address ", config.metrics_address(), ": ", e.what()));
  }
  m.exposer->RegisterCollectable(registry);
  const auto ports = m.exposer->GetListeningPorts();
  const std::string host = config.metrics_address().substr(0, config.metrics_address().rfind(':'));
  m.bound = absl::StrCat(host, ":", ports.empty() ? 0 : ports.front());
  return m;
}

// What the job manager is told about the daemon. Jobs run one at a time and a job's store exists
// only while it runs: a new job fits if it fits in what is available now plus what the running
// job gives back when it ends.
rp::server::JobManagerOptions ManagerOptions(const v1::DaemonConfig& config, const std::string& jobs_dir,
                                             rp::scheduler::Engine* engine) {
  rp::server::JobManagerOptions mo;
  mo.jobs_dir = jobs_dir;
  mo.spec.daemon_devices = config.devices();
  mo.spec.num_devices = static_cast<int>(engine->Stats().devices.size());
  mo.spec.allowed_roots.assign(config.allowed_roots().begin(), config.allowed_roots().end());
  mo.spec.max_queued_batches = config.max_queued_batches();
  mo.spec.host_memory_budget = [engine] {
    return rp::server::AdmissionBudget(rp::server::HostMemoryBudgetNow(), engine->Stats().host_model_bytes,
                                       rp::scheduler::TokenizerParseBytesInFlight());
  };
  mo.spec.max_message_bytes = config.max_message_bytes();
  return mo;
}

struct GrpcEndpoint {
  std::unique_ptr<grpc::Server> server;
  std::vector<std::string> bound;  // the listen addresses with the ports actually bound
};
Step<GrpcEndpoint> ServeGrpc(const v1::DaemonConfig& config, const std::vector<grpc::Service*>& services,
                             rp::server::DaemonMetrics* metrics) {
  std::error_code ec;
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
  interceptors.push_back(rp::server::MakeRpcMetricsInterceptorFactory(metrics));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  for (grpc::Service* s : services) builder.RegisterService(s);
  GrpcEndpoint g;
  g.server = builder.BuildAndStart();
  if (!g.server) return OtherError(absl::StrCat("cannot listen on ", absl::StrJoin(config.listen(), ", ")));
  for (int i = 0; i < config.listen_size(); ++i) {
    const std::string& a = config.listen(i);
    if (absl::StartsWith(a, "unix:")) {
      chmod(a.substr(5).c_str(), 0660);  // the socket's group decides who may talk to the daemon
      g.bound.push_back(a);
    } else {
      g.bound.push_back(absl::StrCat(a.substr(0, a.rfind(':')), ":", ports[static_cast<size_t>(i)]));
    }
  }
  g.server->GetHealthCheckService()->SetServingStatus(true);
  return g;
}

// --ready_file: the bound addresses as JSON, written atomically (scripts and tests wait for it).
void WriteReadyFile(const std::string& path, const std::vector<std::string>& grpc, const std::string& metrics) {
  if (path.empty()) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "{\"grpc\": [";
    for (size_t i = 0; i < grpc.size(); ++i) out << (i ? ", " : "") << '"' << grpc[i] << '"';
    out << "], \"metrics\": \"" << metrics << "\"}\n";
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
}

// The systemd watchdog: pings at half the interval until `stopping`; no thread without one.
std::thread StartWatchdog(const std::atomic<bool>* stopping) {
  uint64_t watchdog_usec = 0;
  if (sd_watchdog_enabled(0, &watchdog_usec) <= 0) return {};
  return std::thread([stopping, watchdog_usec] {
    while (!stopping->load()) {
      sd_notify(0, "WATCHDOG=1");
      for (uint64_t waited = 0; waited < watchdog_usec / 2 && !stopping->load(); waited += 100000) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
}

// SIGTERM and SIGINT are taken by sigwait (ServeUntilStopped): blocked in every thread.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Serves until SIGTERM or SIGINT, then drains: no new jobs, running ones pause at an iteration
// boundary within the deadline, streams end, the server and the engine stop. Returns how many
// jobs were paused.
int ServeUntilStopped(const sigset_t& signals, const v1::DaemonConfig& config, GrpcEndpoint& served,
                      rp::server::JobManager* manager, rp::scheduler::Engine* engine, std::atomic<bool>* stopping) {
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("received {}: draining (deadline {} s)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               config.drain_deadline_seconds());
  sd_notify(0, "STOPPING=1\nSTATUS=draining");
  served.server->GetHealthCheckService()->SetServingStatus(false);
  const int paused = manager->Drain(std::chrono::seconds(config.drain_deadline_seconds()));
  manager->Shutdown();  // ends watch streams and feeders, so in-flight RPCs can complete
  spdlog::debug("job manager stopped; stopping the gRPC server");
  // Streams were ended above; the grace only covers unary calls in flight (an idle client
  // connection would otherwise hold Shutdown for the whole deadline).
  served.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  spdlog::debug("gRPC server stopped");
  *stopping = true;
  engine->Shutdown();
  return paused;
}

}  // namespace

int main(int argc, char** argv) {
  const bool heap_policy = rp::process::ApplyDaemonHeapPolicy();  // before any thread allocates
  absl::SetProgramUsageMessage(
      "roundpiped: the RoundPipe training daemon.\n"
      "  roundpiped --config /etc/roundpipe/roundpiped.json\n"
      "  roundpiped --state_dir /tmp/rp --listen 127.0.0.1:0 --devices cpu:2 --allowed_root /data\n"
      "SIGTERM/SIGINT drain: no new jobs, running jobs pause at an iteration boundary, then exit.");
  absl::ParseCommandLine(argc, argv);
  if (!rp::process::ThreadStackFloorActive()) {
    return Fail(OtherError("thread stack floor interposer not linked (build bug)"));
  }
  auto configured = ConfigFromFileAndFlags();
  if (auto* e = std::get_if<StartupError>(&configured)) return Fail(*e);
  v1::DaemonConfig& config = std::get<v1::DaemonConfig>(configured);
  if (absl::GetFlag(FLAGS_validate_config)) {
    PrintEffectiveConfig(config);
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level()));
  spdlog::set_default_logger(spdlog::default_logger()->clone("roundpiped"));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
  if (!heap_policy) spdlog::warn("glibc refused the heap thresholds: ended jobs may stay resident (see heap_policy.h)");

  const sigset_t signals = BlockStopSignals();  // before any thread starts

  auto jobs_dir = PrepareStateDir(config);
  if (auto* e = std::get_if<StartupError>(&jobs_dir)) return Fail(*e);
  auto tokens = rp::server::ReadTokenFiles(config);
  if (!tokens.ok()) return Fail(ConfigError(std::string(tokens.status().message())));
  rp::server::Authenticator auth(*tokens);
  auto store = OpenJobStore((std::filesystem::path(config.state_dir()) / "jobs.sqlite").string());
  if (auto* e = std::get_if<StartupError>(&store)) return Fail(*e);

  auto registry = std::make_shared<prometheus::Registry>();
  rp::server::DaemonMetrics metrics(*registry);
  metrics.build_info.Add({{"version", RP_VERSION}, {"torch", rp::server::CollectBuildInfo().torch_version()}}).Set(1);
  auto metrics_endpoint = ServeMetrics(config, registry);
  if (auto* e = std::get_if<StartupError>(&metrics_endpoint)) return Fail(*e);
  const std::string metrics_bound = std::get<MetricsEndpoint>(metrics_endpoint).bound;

  if (config.devices() == "auto") {
    const int gpus = rp::scheduler::VisibleCudaDevices();
    config.set_devices(gpus > 0 ? "cuda" : "cpu:1");
    spdlog::info("devices=auto: {} GPU(s) visible, using {}", gpus, config.devices());
  }
  rp::scheduler::EngineOptions engine_options;
  engine_options.devices = config.devices();
  engine_options.max_running_jobs = config.max_running_jobs();
  engine_options.host_memory_limit = config.host_memory_limit_bytes();
  // What a job starting beside running ones may take: the host's memory free now (running jobs'
  // states are already out of it), less what tokenizer parses in flight may still take.
  engine_options.host_memory_available = [] {
    return rp::server::AdmissionBudget(rp::server::HostMemoryBudgetNow(), 0,
                                       rp::scheduler::TokenizerParseBytesInFlight());
  };
  // A cluster member: data-parallel jobs meet in this daemon's store (the jobs it coordinates) or
  // in their coordinator's.
  std::unique_ptr<rp::server::Cluster> cluster;
  if (config.has_cluster()) {
    auto c = rp::server::Cluster::Create(config.cluster());
    if (!c.ok()) return Fail(ConfigError(std::string(c.status().message())));
    cluster = std::move(*c);
    engine_options.rendezvous_store = [raw = cluster.get()](const rp::scheduler::DataParallelSpec& dp) {
      return raw->StoreFor(dp);
    };
  }
  auto engine = rp::scheduler::Engine::Create(engine_options);
  if (!engine.ok()) return Fail(ConfigError(std::string(engine.status().message())));
  rp::server::JobManagerOptions manager_options =
      ManagerOptions(config, std::get<std::string>(jobs_dir), engine->get());
  manager_options.cluster = cluster.get();
  auto manager = rp::server::JobManager::Create(
      engine->get(), std::get<std::unique_ptr<rp::server::JobStore>>(store).get(), &metrics, manager_options);
  if (!manager.ok()) return Fail(OtherError(std::string(manager.status().message())));

  rp::server::JobServiceImpl job_service(manager->get(), &auth);
  rp::server::AdminServiceImpl admin_service(engine->get(), manager->get(), &auth, config.drain_deadline_seconds(),
                                             &metrics, cluster.get());
  rp::server::SetWorkerStates(&metrics, (*engine)->Stats());  // before any step or operator
  std::optional<rp::server::ClusterServiceImpl> cluster_service;
  std::vector<grpc::Service*> services = {&job_service, &admin_service};
  if (cluster) services.push_back(&cluster_service.emplace(manager->get(), cluster.get(), engine->get()));
  auto grpc_endpoint = ServeGrpc(config, services, &metrics);
  if (auto* e = std::get_if<StartupError>(&grpc_endpoint)) return Fail(*e);
  GrpcEndpoint& served = std::get<GrpcEndpoint>(grpc_endpoint);
  if (cluster) {
    for (const std::string& a : served.bound) {
      if (!absl::StartsWith(a, "unix:")) {
        cluster->SetAdvertiseAddress(a);
        break;
      }
    }
    if (cluster->advertise_address().empty()) {
      return Fail(ConfigError("cluster: no TCP listen address to advertise (set cluster.advertise_address)"));
    }
  }

  const std::string status_line =
      absl::StrCat("serving grpc=", absl::StrJoin(served.bound, ","),
                   " metrics=", metrics_bound.empty() ? "off" : metrics_bound, " devices=", config.devices(),
                   cluster ? absl::StrCat(" node=", cluster->node_name(), " peers=", cluster->peers().size()) : "");
  spdlog::info("roundpiped {}: {}", RP_VERSION, status_line);
  std::printf("roundpiped: %s\n", status_line.c_str());
  std::fflush(stdout);
  WriteReadyFile(absl::GetFlag(FLAGS_ready_file), served.bound, metrics_bound);
  sd_notifyf(0, "READY=1\nSTATUS=%s", status_line.c_str());
  std::atomic<bool> stopping{false};
  std::thread watchdog = StartWatchdog(&stopping);

  const int paused = ServeUntilStopped(signals, config, served, manager->get(), engine->get(), &stopping);
  if (watchdog.joinable()) watchdog.join();
  spdlog::info("stopped ({} job(s) paused)", paused);
  return 0;
}
