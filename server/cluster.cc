// This daemon as a cluster member (cluster.h).
#include "server/cluster.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "roundpipe/v1/cluster.grpc.pb.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/status_util.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

namespace {

constexpr auto kStoreWaitPerCall = std::chrono::seconds(10);

// The host of "host:port" / "[v6]:port".
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

bool IsLoopbackAddress(const std::string& address) {
  const std::string host = HostOf(address);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// A data-parallel job's store on its coordinator, asked over the ClusterService: Get waits in
// calls of at most kStoreWaitPerCall until its deadline; a coordinator briefly unreachable is
// asked again until then.
class RemoteStore : public spec::RendezvousStore {
 public:
  RemoteStore(Cluster* cluster, std::string coordinator) : cluster_(cluster), coordinator_(std::move(coordinator)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return cluster_->StoreSet(coordinator_, key, value, std::chrono::seconds(10));
  }

  absl::StatusOr<std::string> Get(const std::string& key, std::chrono::steady_clock::time_point deadline) override {
    absl::Status last = absl::OkStatus();
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      auto r = cluster_->StoreGet(coordinator_, key, std::min<std::chrono::milliseconds>(left, kStoreWaitPerCall));
      if (r.ok() && r->found()) return r->value();
      if (!r.ok()) {
        if (r.status().code() != absl::StatusCode::kUnavailable &&
            r.status().code() != absl::StatusCode::kDeadlineExceeded) {
          return r.status();
        }
        last = r.status();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    return absl::DeadlineExceededError(absl::StrCat("rendezvous: no peer published '", key, "' in time on coordinator ",
                                                    coordinator_, last.ok() ? "" : ": ", last.message()));
  }

 private:
  Cluster* cluster_;
  std::string coordinator_;
};

absl::Status PeerStatus(const grpc::Status& st, const std::string& address) {
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                      absl::StrCat("node at ", address, ": ", st.error_message()));
}

using Stub = v1::ClusterService::Stub;

// One ClusterService call on the member at `address`: the cluster token, a deadline, the
// member's error with its address in the message.
template <typename Resp, typename Fn>
absl::StatusOr<Resp> Call(const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
                          const std::string& address, std::chrono::milliseconds deadline, bool wait_for_ready,
                          Fn&& fn) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_wait_for_ready(wait_for_ready);
  Resp out;
  auto stub = v1::ClusterService::NewStub(channel);
  grpc::Status st = fn(*stub, &ctx, &out);
  if (!st.ok()) return PeerStatus(st, address);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(const v1::ClusterConfig& config) {
  std::unique_ptr<Cluster> c(new Cluster());
  c->node_name_ = config.node_name();
  c->advertise_ = config.advertise_address();
  c->collective_host_ = config.collective_host();
  c->peers_.assign(config.peers().begin(), config.peers().end());
  auto token = ReadWholeFile(config.token_file());
  if (!token.ok()) return absl::InvalidArgumentError(absl::StrCat("cluster.token_file: ", token.status().message()));
  c->token_ = std::string(absl::StripAsciiWhitespace(token->substr(0, token->find('\n'))));
  if (c->token_.size() < 16) {
    return absl::InvalidArgumentError("cluster.token_file: holds no token of at least 16 characters");
  }
  if (!config.peer_ca_file().empty()) {
    auto ca = ReadWholeFile(config.peer_ca_file());
    if (!ca.ok()) return absl::InvalidArgumentError(absl::StrCat("cluster.peer_ca_file: ", ca.status().message()));
    c->peer_ca_ = *ca;
  }
  return c;
}

void Cluster::SetAdvertiseAddress(const std::string& address) {
  if (advertise_.empty()) advertise_ = address;
}

std::string Cluster::collective_host() const {
  return collective_host_.empty() ? HostOf(advertise_) : collective_host_;
}

std::shared_ptr<spec::RendezvousStore> Cluster::StoreFor(const scheduler::DataParallelSpec& dp) {
  if (dp.coordinator.empty()) return std::shared_ptr<spec::RendezvousStore>(&store_, [](spec::RendezvousStore*) {});
  return std::make_shared<RemoteStore>(this, dp.coordinator);
}

std::shared_ptr<grpc::Channel> Cluster::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& ch = channels_[address];
  if (!ch) {
    std::shared_ptr<grpc::ChannelCredentials> creds;
    if (peer_ca_.empty()) {
      creds = grpc::InsecureChannelCredentials();
    } else {
      grpc::SslCredentialsOptions o;
      o.pem_root_certs = peer_ca_;
      creds = grpc::SslCredentials(o);
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    // A member that was down is tried again within a second of coming back (gRPC's default
    // backoff grows to two minutes).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    ch = grpc::CreateCustomChannel(address, creds, args);
  }
  return ch;
}

absl::StatusOr<v1::NodeStatus> Cluster::StartNode(const std::string& address, const v1::StartNodeRequest& request,
                                                  std::chrono::milliseconds deadline) {
  return Call<v1::NodeStatus>(
      ChannelTo(address), token_, address, deadline, false,
      [&](Stub& s, grpc::ClientContext* c, v1::NodeStatus* out) { return s.StartNode(c, request, out); });
}

absl::StatusOr<v1::NodeStatus> Cluster::GetNode(const std::string& address, const std::string& job_id,
                                                std::chrono::milliseconds deadline, bool wait_for_ready) {
  v1::NodeRequest req;
  req.set_job_id(job_id);
  return Call<v1::NodeStatus>(
      ChannelTo(address), token_, address, deadline, wait_for_ready,
      [&](Stub& s, grpc::ClientContext* c, v1::NodeStatus* out) { return s.GetNode(c, req, out); });
}

absl::StatusOr<v1::NodeStatus> Cluster::CancelNode(const std::string& address, const std::string& job_id,
                                                   std::chrono::milliseconds deadline) {
  v1::NodeRequest req;
  req.set_job_id(job_id);
  return Call<v1::NodeStatus>(
      ChannelTo(address), token_, address, deadline, false,
      [&](Stub& s, grpc::ClientContext* c, v1::NodeStatus* out) { return s.CancelNode(c, req, out); });
}

absl::Status Cluster::StoreSet(const std::string& address, const std::string& key, const std::string& value,
                               std::chrono::milliseconds deadline) {
  v1::StoreSetRequest req;
  req.set_key(key);
  req.set_value(value);
  return Call<v1::StoreSetResponse>(
             ChannelTo(address), token_, address, deadline, false,
             [&](Stub& s, grpc::ClientContext* c, v1::StoreSetResponse* out) { return s.StoreSet(c, req, out); })
      .status();
}

absl::StatusOr<v1::StoreGetResponse> Cluster::StoreGet(const std::string& address, const std::string& key,
                                                       std::chrono::milliseconds wait) {
  v1::StoreGetRequest req;
  req.set_key(key);
  req.set_wait_ms(wait.count());
  return Call<v1::StoreGetResponse>(
      ChannelTo(address), token_, address, wait + std::chrono::seconds(5), false,
      [&](Stub& s, grpc::ClientContext* c, v1::StoreGetResponse* out) { return s.StoreGet(c, req, out); });
}

absl::StatusOr<v1::ClusterMember> Cluster::Describe(const std::string& address, std::chrono::milliseconds deadline) {
  return Call<v1::ClusterMember>(ChannelTo(address), token_, address, deadline, false,
                                 [&](Stub& s, grpc::ClientContext* c, v1::ClusterMember* out) {
                                   return s.Describe(c, v1::DescribeRequest(), out);
                                 });
}

grpc::Status Cluster::Authorized(const grpc::ServerContextBase& context) const {
  return Authenticator({token_}).Check(context);
}

void ApplyClusterDefaults(v1::DaemonConfig* config) {
  if (!config->has_cluster()) return;
  v1::ClusterConfig* c = config->mutable_cluster();
  if (c->node_name().empty()) {
    char host[256] = {};
    c->set_node_name(gethostname(host, sizeof(host) - 1) == 0 && host[0] != 0 ? host : "node");
  }
}

void CheckClusterConfig(const v1::DaemonConfig& config, std::vector<std::string>* problems) {
  if (!config.has_cluster()) return;
  const v1::ClusterConfig& c = config.cluster();
  if (c.token_file().empty()) {
    problems->push_back("cluster.token_file: required (the secret the cluster's daemons present to each other)");
  } else if (auto t = ReadWholeFile(c.token_file());
             !t.ok() || absl::StripAsciiWhitespace(t->substr(0, t->find('\n'))).size() < 16) {
    problems->push_back(
        absl::StrCat("cluster.token_file: '", c.token_file(), "' holds no readable token of at least 16 characters"));
  }
  if (!c.peer_ca_file().empty() && !ReadWholeFile(c.peer_ca_file()).ok()) {
    problems->push_back(absl::StrCat("cluster.peer_ca_file: cannot read '", c.peer_ca_file(), "'"));
  }
  if (c.peers_size() > 64) problems->push_back("cluster.peers: at most 64");
  for (const std::string& p : c.peers()) {
    const size_t colon = p.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(p.substr(colon + 1), &port) || port < 1 ||
        port > 65535) {
      problems->push_back(absl::StrCat("cluster.peers '", p, "': expected host:port"));
    } else if (c.peer_ca_file().empty() && !IsLoopbackAddress(p) && !config.allow_insecure_remote()) {
      problems->push_back(absl::StrCat("cluster.peers '", p,
                                       "': not a loopback address; set cluster.peer_ca_file (TLS), or "
                                       "allow_insecure_remote: true"));
    }
  }
  if (c.node_name().empty() || c.node_name().size() > 128) {
    problems->push_back("cluster.node_name: 1 to 128 characters");
  }
}

}  // namespace rp::server
