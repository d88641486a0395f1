// Config validation, path confinement and bearer-token comparison.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "server/auth.h"
#include "server/config.h"
#include "server/paths.h"
#include "tests/support/temp_dir.h"

namespace rp::server {
namespace {
namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) { return rp::testing::FreshTempDir("server_test", name); }

void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(Config, DefaultsAreValidAndLoopbackOnly) {
  roundpipe::v1::DaemonConfig c;
  ApplyDefaults(&c);
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  ASSERT_EQ(c.listen_size(), 2);
  for (const auto& a : c.listen()) EXPECT_TRUE(IsLocalListenAddress(a)) << a;
  EXPECT_EQ(c.max_queued_batches(), 8);
  EXPECT_EQ(c.max_running_jobs(), 1);
  c.set_max_running_jobs(65);
  EXPECT_NE(ValidateConfig(c).message().find("max_running_jobs must lie in [1, 64] (got 65)"), std::string::npos);
  c.set_max_running_jobs(-1);
  EXPECT_FALSE(ValidateConfig(c).ok());
  c.set_max_running_jobs(2);
  EXPECT_EQ(c.host_memory_limit_bytes(), 0);  // no limit by default
  c.set_host_memory_limit_bytes(-5);
  EXPECT_NE(ValidateConfig(c).message().find("host_memory_limit_bytes must be 0 (no limit) or positive (got -5)"),
            std::string::npos)
      << ValidateConfig(c);
  c.set_host_memory_limit_bytes(int64_t{8} << 30);
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

TEST(Config, RemoteListenerNeedsTlsOrTokensUnlessExplicitlyAllowed) {
  roundpipe::v1::DaemonConfig c;
  c.add_listen("0.0.0.0:50151");
  ApplyDefaults(&c);
  absl::Status st = ValidateConfig(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a loopback address"), std::string::npos) << st;
  c.set_allow_insecure_remote(true);
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.set_allow_insecure_remote(false);
  const fs::path d = TempDir("tokens");
  Write(d / "short", "abc\n");
  c.add_token_files((d / "short").string());
  st = ValidateConfig(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("at least 16 characters"), std::string::npos) << st;
  Write(d / "good", "0123456789abcdef0123\nignored second line\n");
  c.set_token_files(0, (d / "good").string());
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  auto tokens = ReadTokenFiles(c);
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(*tokens, std::vector<std::string>{"0123456789abcdef0123"});
}

TEST(Config, EveryProblemIsNamed) {
  roundpipe::v1::DaemonConfig c;
  c.add_listen("localhost");
  c.add_allowed_roots("/definitely/not/here");
  c.set_log_level("loud");
  c.mutable_tls()->set_cert_file("/nope.pem");
  ApplyDefaults(&c);
  absl::Status st = ValidateConfig(c);
  ASSERT_FALSE(st.ok());
  for (const char* want : {"listen 'localhost'", "allowed_roots", "log_level 'loud'", "tls: cannot read"}) {
    EXPECT_NE(st.message().find(want), std::string::npos) << want << " in " << st;
  }
}

// The paced device backend (schedule timing without data) is never a training backend: the
// daemon refuses it by name, pointing at the benchmark that runs it.
TEST(Config, PacedDevicesAreRefusedWithTheBenchmarkNamed) {
  roundpipe::v1::DaemonConfig c;
  c.set_devices("paced:8");
  ApplyDefaults(&c);
  absl::Status st = ValidateConfig(c);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("devices 'paced:8': paced workers are a benchmark backend"), std::string::npos) << st;
  EXPECT_NE(st.message().find("paced_bench"), std::string::npos) << st;
  c.set_devices("cpu:2");
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

// DaemonConfig.cluster: a token is required and must be readable and long enough; peers are
// host:port, and a peer beyond loopback needs TLS (peer_ca_file) unless insecure remotes are
// allowed; the node name defaults to the host's.
TEST(Config, AClusterNeedsItsTokenAndTlsBeyondLoopback) {
  const fs::path dir = TempDir("cluster");
  roundpipe::v1::DaemonConfig c;
  c.mutable_cluster()->add_peers("127.0.0.1:7001");
  ApplyDefaults(&c);
  EXPECT_FALSE(c.cluster().node_name().empty());
  EXPECT_NE(ValidateConfig(c).message().find("cluster.token_file: required"), std::string::npos) << ValidateConfig(c);
  Write(dir / "short", "abc\n");
  c.mutable_cluster()->set_token_file((dir / "short").string());
  EXPECT_NE(ValidateConfig(c).message().find("no readable token of at least 16 characters"), std::string::npos);
  Write(dir / "token", "0123456789abcdef0123\n");
  c.mutable_cluster()->set_token_file((dir / "token").string());
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.mutable_cluster()->add_peers("10.0.0.2:7001");
  EXPECT_NE(ValidateConfig(c).message().find("cluster.peers '10.0.0.2:7001': not a loopback address"),
            std::string::npos)
      << ValidateConfig(c);
  Write(dir / "ca.pem", "-----BEGIN CERTIFICATE-----\n");
  c.mutable_cluster()->set_peer_ca_file((dir / "ca.pem").string());
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.mutable_cluster()->add_peers("no-port");
  EXPECT_NE(ValidateConfig(c).message().find("cluster.peers 'no-port': expected host:port"), std::string::npos);
}

TEST(Config, JsonFileWithUnknownFieldIsRejected) {
  const fs::path d = TempDir("json");
  Write(d / "ok.json", R"({"listen": ["127.0.0.1:0"], "devices": "cpu:2", "maxQueuedBatches": 3})");
  auto c = LoadConfigFile((d / "ok.json").string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_queued_batches(), 3);
  Write(d / "bad.json", R"({"listen": ["127.0.0.1:0"], "devcies": "cpu:2"})");
  auto bad = LoadConfigFile((d / "bad.json").string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("devcies"), std::string::npos) << bad.status();
  EXPECT_FALSE(LoadConfigFile((d / "missing.json").string()).ok());
}

TEST(Paths, InsideRootsOnlyEvenThroughDotDotAndSymlinks) {
  const fs::path d = TempDir("paths");
  fs::create_directories(d / "root" / "data");
  fs::create_directories(d / "outside");
  Write(d / "root" / "data" / "a.bin", "x");
  Write(d / "outside" / "secret.bin", "x");
  fs::create_symlink(d / "outside", d / "root" / "escape");
  const std::vector<std::string> roots = {(d / "root").string()};

  auto ok = ResolveInsideRoots((d / "root" / "data" / "a.bin").string(), roots, "f");
  ASSERT_TRUE(ok.ok()) << ok.status();
  // A path that does not exist yet (an output dir) is fine inside a root.
  EXPECT_TRUE(ResolveInsideRoots((d / "root" / "new" / "deeper").string(), roots, "f").ok());
  for (const fs::path& bad : {d / "outside" / "secret.bin", d / "root" / ".." / "outside" / "secret.bin",
                              d / "root" / "escape" / "secret.bin", d / "root" / "nothere" / ".." / ".." / "outside",
                              fs::path("/etc/passwd")}) {
    auto st = ResolveInsideRoots(bad.string(), roots, "data.token_file.path");
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.status().code(), absl::StatusCode::kPermissionDenied) << bad << ": " << st.status();
    EXPECT_NE(st.status().message().find("data.token_file.path"), std::string::npos);
  }
  // A root prefix is not a parent: /x/root2 is not inside /x/root.
  fs::create_directories(d / "root2");
  EXPECT_FALSE(ResolveInsideRoots((d / "root2").string(), roots, "f").ok());
  EXPECT_FALSE(ResolveInsideRoots("anything", {}, "f").ok());  // no roots: no paths
}

TEST(Auth, SecureEqualsComparesWholeStrings) {
  EXPECT_TRUE(Authenticator::SecureEquals("abcdef", "abcdef"));
  EXPECT_FALSE(Authenticator::SecureEquals("abcdef", "abcdeg"));
  EXPECT_FALSE(Authenticator::SecureEquals("abcdef", "abcde"));
  EXPECT_FALSE(Authenticator::SecureEquals("", "a"));
  EXPECT_TRUE(Authenticator::SecureEquals("", ""));
}

}  // namespace
}  // namespace rp::server
