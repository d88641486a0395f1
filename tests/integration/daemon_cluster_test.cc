// A cluster of real daemons on loopback (DaemonConfig.cluster, JobSpec.cluster): a job submitted
// with cluster.nodes = K to daemon "a" runs on "a" and K-1 of its peers, each reading its share of
// every global batch from the same data file and summing gradients through Gloo (in each daemon's
// communicator processes) before every step. The final weights equal the same job on one daemon
// (fp32 summation order aside); a node killed mid-job fails the job on the others within its
// timeout, naming the node, and every daemon serves on; a node that refuses the job fails the
// submission and the nodes already started are cancelled.
#include <grpcpp/create_channel.h>

#include "roundpipe/v1/cluster.grpc.pb.h"
#include "tests/integration/fixtures.h"

namespace rp::testing {
namespace {

namespace v1 = roundpipe::v1;
using std::chrono::seconds;

constexpr int kSteps = 3;

class ClusterTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    token_ = root_ + "/cluster.token";
    std::ofstream(token_) << "cluster-secret-0123456789abcdef\n";
  }
  void TearDown() override {
    for (auto& [name, d] : peers_) {
      if (HasFailure()) std::fprintf(stderr, "---- daemon %s ----\n%s\n", name.c_str(), d->Output().c_str());
      d->Stop(9);
    }
    DaemonTest::TearDown();
  }
  // Node `name`'s config: the cluster section (and `extra` JSON members).
  std::string Config(const std::string& name, const std::vector<std::string>& peers, const std::string& extra = "") {
    nlohmann::json j;
    j["cluster"] = {{"nodeName", name}, {"peers", peers}, {"tokenFile", token_}};
    std::string text = j.dump();
    if (!extra.empty()) text = text.substr(0, text.size() - 1) + "," + extra + "}";
    const std::string path = root_ + "/" + name + ".json";
    std::ofstream(path) << text;
    return path;
  }
  // Starts peer daemon `name` (one CPU worker, the shared data root); `listen`: on that address
  // (a node restarted where its cluster knows it).
  DaemonProcess& StartPeer(const std::string& name, const std::string& extra = "", const std::string& listen = "") {
    auto& d = peers_[name];
    if (!d) d = std::make_unique<DaemonProcess>();
    std::vector<std::string> args = {"--config", Config(name, {}, extra), "--devices",
                                     "cpu:1",    "--allowed_root",        root_ + "/data"};
    if (!listen.empty()) args.insert(args.end(), {"--listen", listen});
    EXPECT_TRUE(d->Start(root_ + "/state-" + name, args)) << d->Output();
    return *d;
  }
  // The coordinator "a" (this fixture's daemon_) with the peers started so far.
  bool StartCoordinator(const std::vector<std::string>& peers) {
    std::vector<std::string> addresses;
    for (const std::string& p : peers) addresses.push_back(peers_.at(p)->address());
    return StartDaemon({"--config", Config("a", addresses), "--devices", "cpu:1"});
  }
  // 12 sequences of 16 per step (2 per micro-batch): 6 per node on 2 nodes, 4 on 3.
  v1::JobSpec Spec(int nodes, int steps) {
    v1::JobSpec s = TinySpec();
    s.mutable_batching()->set_global_batch(12);
    s.mutable_batching()->set_micro_batch(2);
    s.mutable_data()->mutable_token_file()->set_path(TokenFile(12 * 16 * steps + 1));
    s.set_max_steps(steps);
    s.mutable_cluster()->set_nodes(nodes);
    s.mutable_cluster()->set_timeout_seconds(30);
    return s;
  }
  std::map<std::string, at::Tensor> Weights(client::Client& c, const std::string& id, const std::string& dir) {
    auto path = c.Export(id, root_ + "/data/" + dir);
    EXPECT_TRUE(path.ok()) << path.status();
    return path.ok() ? ReadSafetensors(*path + "/model.safetensors") : std::map<std::string, at::Tensor>{};
  }

  std::string token_;
  std::map<std::string, std::unique_ptr<DaemonProcess>> peers_;
};

TEST_F(ClusterTest, TwoAndThreeNodesTrainWhatOneDaemonTrainsOnTheWholeBatch) {
  StartPeer("b");
  StartPeer("c");
  ASSERT_TRUE(StartCoordinator({"b", "c"})) << daemon_.Output();
  auto a = daemon_.Connect();
  // GetServerInfo (`roundpipe info`) lists every member with its devices.
  auto info = a->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->cluster().members_size(), 3);
  EXPECT_EQ(info->cluster().node(), "a");
  for (int i = 0; i < 3; ++i) {
    const v1::ClusterMember& m = info->cluster().members(i);
    EXPECT_TRUE(m.reachable()) << m.error();
    EXPECT_EQ(m.node(), std::string(1, static_cast<char>('a' + i)));
    EXPECT_EQ(m.devices_size(), 1);
  }
  auto single = a->Submit(Spec(0, kSteps));
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE(Watcher(*a, single->id()).WaitForState(v1::JOB_STATE_SUCCEEDED));
  const auto want = Weights(*a, single->id(), "single");
  const v1::Job alone = *a->Get(single->id());
  ASSERT_FALSE(want.empty());

  for (const int k : {2, 3}) {
    auto job = a->Submit(Spec(k, kSteps));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(Watcher(*a, job->id()).WaitForState(v1::JOB_STATE_SUCCEEDED)) << k << " nodes";
    // The coordinator's record lists every node, each seen to succeed.
    ASSERT_TRUE(WaitForRecord(
        *a, job->id(),
        [&](const v1::Job& r) {
          if (r.cluster().nodes_size() != k) return false;
          for (const v1::ClusterNode& n : r.cluster().nodes()) {
            if (n.state() != v1::JOB_STATE_SUCCEEDED) return false;
          }
          return true;
        },
        seconds(20)))
        << a->Get(job->id())->DebugString();
    const v1::Job done = *a->Get(job->id());
    EXPECT_EQ(done.cluster().size(), k);
    EXPECT_EQ(done.cluster().nodes(1).node(), "b");
    // One global batch per step over all nodes: the tokens of the job alone, not k times them.
    EXPECT_EQ(done.progress().tokens(), alone.progress().tokens()) << k << " nodes";
    EXPECT_NEAR(done.progress().last_loss(), alone.progress().last_loss(), 1e-5);
    const auto got = Weights(*a, job->id(), "nodes" + std::to_string(k));
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, w] : want) {
      const double scale = w.abs().max().item<double>();
      const double diff = (got.at(name) - w).abs().max().item<double>();
      EXPECT_LE(diff, 1e-6 * scale + 1e-8) << k << " nodes, " << name << ": " << diff << " of " << scale;
    }
    // The optimizer state is sharded over the nodes (ZeRO-1): each holds about 1/k of the moments
    // (AdamW: 8 bytes per trained element), the rest of its model states as one daemon does.
    int64_t elements = 0;
    for (const auto& [name, w] : want) elements += w.numel();
    const double saved =
        static_cast<double>(alone.host_memory().peak_state_bytes() - done.host_memory().peak_state_bytes()) /
        static_cast<double>(8 * elements);
    std::printf("%d nodes: node 0 holds %lld bytes of model states, one daemon %lld: %.0f %% of the moments saved\n", k,
                static_cast<long long>(done.host_memory().peak_state_bytes()),
                static_cast<long long>(alone.host_memory().peak_state_bytes()), 100 * saved);
    EXPECT_NEAR(saved, 1.0 - 1.0 / k, 0.15) << k << " nodes";
    // Admission predicted the node's share: at least what it held, less than one daemon's job.
    EXPECT_GE(done.host_memory().predicted_state_bytes(), done.host_memory().peak_state_bytes());
    EXPECT_LT(done.host_memory().predicted_state_bytes(), alone.host_memory().predicted_state_bytes());
    // Per-node detail on the coordinator: every node's throughput, bubble, host memory and its
    // exchange — each step a node puts every trained element into the sum to the owners and the
    // all-gather of the weights (fp32: 8 bytes per element), plus a few control sums.
    for (const v1::ClusterNode& n : done.cluster().nodes()) {
      const v1::JobProgress& p = n.progress();
      EXPECT_EQ(p.step(), kSteps) << n.node();
      EXPECT_GT(p.tokens_per_second(), 0) << n.node();
      EXPECT_GT(n.host_memory().peak_state_bytes(), 0) << n.node();
      EXPECT_GT(p.collective_seconds(), 0) << n.node();
      EXPECT_NEAR(static_cast<double>(p.last_collective_bytes()), 8.0 * static_cast<double>(elements),
                  0.01 * 8.0 * static_cast<double>(elements))
          << n.node();
      EXPECT_GE(p.collective_bytes(), kSteps * p.last_collective_bytes()) << n.node();
    }
    // Node 1 on "b" holds the same weights, bit for bit.
    auto b = peers_.at("b")->Connect();
    const std::string b_job = done.cluster().nodes(1).job_id();
    auto on_b = b->Get(b_job);
    ASSERT_TRUE(on_b.ok()) << on_b.status();
    EXPECT_EQ(on_b->cluster().rank(), 1);
    EXPECT_EQ(on_b->cluster().coordinator_job_id(), job->id());
    const auto node1 = Weights(*b, b_job, "b-nodes" + std::to_string(k));
    for (const auto& [name, w] : got) EXPECT_TRUE(at::equal(w, node1.at(name))) << name;
  }
}

TEST_F(ClusterTest, ANodeKilledMidJobFailsTheJobNamingItAndEveryDaemonServesOn) {
  StartPeer("b");
  StartPeer("c");
  ASSERT_TRUE(StartCoordinator({"b", "c"})) << daemon_.Output();
  auto a = daemon_.Connect();
  v1::JobSpec spec = Spec(3, 400);
  spec.mutable_cluster()->set_timeout_seconds(4);
  auto job = a->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitForRecord(
      *a, job->id(), [](const v1::Job& r) { return r.progress().step() >= 2; }, seconds(120)));
  const std::string c_job = a->Get(job->id())->cluster().nodes(2).job_id();
  const auto t0 = std::chrono::steady_clock::now();
  peers_.at("c")->Stop(9);
  Watcher w(*a, job->id());
  ASSERT_TRUE(w.WaitForState(v1::JOB_STATE_FAILED, seconds(60)));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const v1::Job failed = *a->Get(job->id());
  std::printf("the job failed %.2f s after node 2 was killed: %s\n", took, failed.error().c_str());
  EXPECT_LT(took, 4 + 5 + 6.0) << "the collective timeout (4 s) and its grace (5 s), with room";
  EXPECT_NE(failed.error().find("node 2 ('c'"), std::string::npos) << failed.error();
  // Node 1 on "b" ends too (its collectives fail, or the coordinator cancels it).
  auto b = peers_.at("b")->Connect();
  const std::string b_job = failed.cluster().nodes(1).job_id();
  ASSERT_TRUE(WaitForRecord(
      *b, b_job,
      [](const v1::Job& r) { return r.state() == v1::JOB_STATE_FAILED || r.state() == v1::JOB_STATE_CANCELLED; },
      seconds(30)));
  // Every daemon serves on: "b" trains a job of its own, "a" answers.
  v1::JobSpec plain = Spec(0, 2);
  auto own = b->Submit(plain);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE(Watcher(*b, own->id()).WaitForState(v1::JOB_STATE_SUCCEEDED));
  auto info = a->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->cluster().members_size(), 3);
  EXPECT_FALSE(info->cluster().members(2).reachable());
  EXPECT_TRUE(info->cluster().members(1).reachable());
  // "c" restarted lists its node as failed: a node never continues alone.
  StartPeer("c");
  auto c = peers_.at("c")->Connect();
  auto after = c->Get(c_job);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(after->error().find("does not resume after a daemon restart"), std::string::npos) << after->error();
}

// A cluster job resumes from the newest checkpoint all its nodes hold: after a node was killed
// and restarted, on all of them, ending bit-identical to the straight run; after a cancel, on
// fewer nodes (each holds the whole optimizer state in its checkpoint), ending equal to it within
// fp32 summation order.
TEST_F(ClusterTest, AClusterJobResumesAfterALostNodeBitIdenticalAndOnFewerNodes) {
  StartPeer("b");
  StartPeer("c");
  ASSERT_TRUE(StartCoordinator({"b", "c"})) << daemon_.Output();
  auto a = daemon_.Connect();
  v1::JobSpec spec = Spec(3, 40);
  spec.mutable_checkpoint()->set_every_steps(2);
  spec.mutable_cluster()->set_timeout_seconds(5);
  auto straight = a->Submit(spec);
  ASSERT_TRUE(straight.ok()) << straight.status();
  ASSERT_TRUE(Watcher(*a, straight->id()).WaitForState(v1::JOB_STATE_SUCCEEDED, seconds(300)));
  const auto want = Weights(*a, straight->id(), "straight");

  // Node 2 killed mid-job, then back: the job resumes on all three.
  auto killed = a->Submit(spec);
  ASSERT_TRUE(killed.ok()) << killed.status();
  ASSERT_TRUE(WaitForRecord(
      *a, killed->id(), [](const v1::Job& r) { return r.progress().step() >= 5; }, seconds(120)));
  const std::string c_address = peers_.at("c")->address();
  peers_.at("c")->Stop(9);
  ASSERT_TRUE(Watcher(*a, killed->id()).WaitForState(v1::JOB_STATE_FAILED, seconds(60)));
  auto too_soon = a->Resume(killed->id());
  EXPECT_EQ(too_soon.status().code(), absl::StatusCode::kUnavailable) << too_soon.status();
  EXPECT_NE(too_soon.status().message().find("node 2 ('c'"), std::string::npos) << too_soon.status();
  StartPeer("c", "", c_address);
  auto resumed = a->Resume(killed->id());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  std::printf("resumed: %s\n", resumed->message().c_str());
  ASSERT_TRUE(Watcher(*a, killed->id()).WaitForState(v1::JOB_STATE_SUCCEEDED, seconds(300)));
  const auto again = Weights(*a, killed->id(), "resumed3");
  ASSERT_EQ(again.size(), want.size());
  for (const auto& [name, w] : want) EXPECT_TRUE(at::equal(again.at(name), w)) << name;

  // Cancelled mid-job, resumed on two nodes.
  auto cancelled = a->Submit(spec);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  ASSERT_TRUE(WaitForRecord(
      *a, cancelled->id(), [](const v1::Job& r) { return r.progress().step() >= 3; }, seconds(120)));
  ASSERT_TRUE(a->Cancel(cancelled->id()).ok());
  ASSERT_TRUE(Watcher(*a, cancelled->id()).WaitForState(v1::JOB_STATE_CANCELLED, seconds(60)));
  EXPECT_EQ(a->Resume(cancelled->id(), 4).status().code(), absl::StatusCode::kInvalidArgument);
  auto on_two = a->Resume(cancelled->id(), 2);
  ASSERT_TRUE(on_two.ok()) << on_two.status();
  std::printf("resumed: %s\n", on_two->message().c_str());
  ASSERT_TRUE(Watcher(*a, cancelled->id()).WaitForState(v1::JOB_STATE_SUCCEEDED, seconds(300)));
  EXPECT_EQ(a->Get(cancelled->id())->cluster().size(), 2);
  const auto two = Weights(*a, cancelled->id(), "resumed2");
  double worst = 0;
  for (const auto& [name, w] : want) {
    const double rel = (two.at(name) - w).abs().max().item<double>() / (w.abs().max().item<double>() + 1e-12);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-5) << name;
  }
  std::printf("resumed on 2 of 3 nodes: largest difference %.3g of a tensor's largest value\n", worst);
}

// A node that goes silent (stopped, as a node cut off from the network looks) fails the job on the
// coordinator after the collective timeout, naming the silent node; it serves again once resumed.
TEST_F(ClusterTest, ASilentNodeFailsTheJobAfterItsTimeoutNamingIt) {
  StartPeer("b");
  ASSERT_TRUE(StartCoordinator({"b"})) << daemon_.Output();
  auto a = daemon_.Connect();
  v1::JobSpec spec = Spec(2, 400);
  spec.mutable_cluster()->set_timeout_seconds(3);
  auto job = a->Submit(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitForRecord(
      *a, job->id(), [](const v1::Job& r) { return r.progress().step() >= 2; }, seconds(120)));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(peers_.at("b")->pid(), SIGSTOP), 0);
  Watcher w(*a, job->id());
  const bool failed = w.WaitForState(v1::JOB_STATE_FAILED, seconds(60));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(kill(peers_.at("b")->pid(), SIGCONT), 0);
  ASSERT_TRUE(failed);
  const v1::Job record = *a->Get(job->id());
  std::printf("the job failed %.2f s after node 1 went silent: %s\n", took, record.error().c_str());
  EXPECT_LT(took, 3 + 5 + 3 + 6.0) << "the collective timeout (3 s), its grace (5 s), one look (3 s), with room";
  EXPECT_NE(record.error().find("node 1 ('b'"), std::string::npos) << record.error();
  auto b = peers_.at("b")->Connect();
  const std::string b_job = record.cluster().nodes(1).job_id();
  EXPECT_TRUE(WaitForRecord(
      *b, b_job,
      [](const v1::Job& r) { return r.state() == v1::JOB_STATE_FAILED || r.state() == v1::JOB_STATE_CANCELLED; },
      seconds(30)));
  auto again = a->Submit(Spec(2, kSteps));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(Watcher(*a, again->id()).WaitForState(v1::JOB_STATE_SUCCEEDED)) << "the cluster trains again";
}

TEST_F(ClusterTest, BadClusterJobsAreRefusedAndARefusingNodeUndoesTheOthers) {
  StartPeer("b");
  StartPeer("c", "\"hostMemoryLimitBytes\": \"1000\"");  // takes no job of any size
  ASSERT_TRUE(StartCoordinator({"b", "c"})) << daemon_.Output();
  auto a = daemon_.Connect();
  auto too_many = a->Submit(Spec(4, kSteps));
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("cluster.nodes"), std::string::npos) << too_many.status();
  v1::JobSpec streamed = Spec(2, kSteps);
  streamed.mutable_data()->set_stream(true);
  EXPECT_EQ(a->Submit(streamed).status().code(), absl::StatusCode::kInvalidArgument);
  v1::JobSpec odd = Spec(2, kSteps);
  odd.mutable_batching()->set_global_batch(10);  // 5 per node: not a multiple of micro_batch 2
  auto refused = a->Submit(odd);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("over 2 nodes"), std::string::npos) << refused.status();
  // "c" refuses (its host memory limit): the submission fails naming it, "b"'s node is cancelled.
  auto undone = a->Submit(Spec(3, kSteps));
  EXPECT_EQ(undone.status().code(), absl::StatusCode::kResourceExhausted) << undone.status();
  EXPECT_NE(undone.status().message().find("node 2 did not take the job"), std::string::npos) << undone.status();
  auto b = peers_.at("b")->Connect();
  auto b_jobs = b->List();
  ASSERT_TRUE(b_jobs.ok());
  ASSERT_EQ(b_jobs->size(), 1u);
  EXPECT_TRUE(WaitForRecord(
      *b, b_jobs->front().id(), [](const v1::Job& r) { return r.state() == v1::JOB_STATE_CANCELLED; }, seconds(30)));
  EXPECT_TRUE(a->List()->empty()) << "the refused job is not listed on the coordinator";
  // A daemon outside any cluster refuses cluster jobs; its peers' service wants the cluster token.
  auto c = peers_.at("c")->Connect();
  EXPECT_EQ(c->Submit(Spec(2, kSteps)).status().code(), absl::StatusCode::kInvalidArgument)
      << "c has no peers to run node 1";
  auto stub =
      v1::ClusterService::NewStub(grpc::CreateChannel(peers_.at("b")->address(), grpc::InsecureChannelCredentials()));
  for (const std::string& token : {std::string(), std::string("a-client-token-of-the-wrong-kind")}) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::StartNodeRequest req;
    *req.mutable_spec() = Spec(2, kSteps);
    req.set_rank(1);
    req.set_size(2);
    req.set_group("intruder");
    req.set_coordinator_address("127.0.0.1:1");
    req.set_coordinator_job_id("job-1");
    v1::NodeStatus out;
    EXPECT_EQ(stub->StartNode(&ctx, req, &out).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(b->List()->size(), 1u) << "no job was started by a caller without the cluster token";
  // With the token, a node whose data file is not the coordinator's refuses, naming both digests.
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer cluster-secret-0123456789abcdef");
  v1::StartNodeRequest req;
  *req.mutable_spec() = Spec(2, kSteps);
  req.set_rank(1);
  req.set_size(2);
  req.set_group("other-data");
  req.set_coordinator_node("a");
  req.set_coordinator_address(daemon_.address());
  req.set_coordinator_job_id("job-000099");
  req.set_data_sha256(std::string(64, '0'));
  v1::NodeStatus out;
  const grpc::Status differs = stub->StartNode(&ctx, req, &out);
  EXPECT_EQ(differs.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(differs.error_message().find("differs from the coordinator's (SHA-256 "), std::string::npos)
      << differs.error_message();
  EXPECT_EQ(b->List()->size(), 1u);
}

}  // namespace
}  // namespace rp::testing
