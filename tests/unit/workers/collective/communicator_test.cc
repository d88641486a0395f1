// Communicator processes (workers/collective/): groups of 2 and 3 real roundpipe-comm processes
// on loopback run Gloo's collectives on the shared buffer — every result checked element by
// element against sums computed here — and fail within their deadlines, naming the operation and
// the rank, when a peer is killed, stopped or never comes; the binary binds Debian's Gloo, never
// LibTorch's copy.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/run_command.h"
#include "workers/collective/communicator.h"

namespace rp::workers::collective {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kFloats = 1 << 16;

// A group of `size` communicators started together (each Start blocks until all connected).
std::vector<std::unique_ptr<Communicator>> StartGroup(int size, InMemoryStore* store, const std::string& group,
                                                      std::chrono::milliseconds connect = std::chrono::seconds(20)) {
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(size));
  std::vector<absl::Status> status(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions o;
      o.binary = RP_COMM_BINARY;
      o.rank = r;
      o.size = size;
      o.buffer_bytes = kFloats * 4;
      o.connect_timeout = connect;
      o.group = group;
      auto c = Communicator::Start(o, store);
      if (c.ok())
        comms[static_cast<size_t>(r)] = std::move(*c);
      else
        status[static_cast<size_t>(r)] = c.status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) EXPECT_TRUE(status[static_cast<size_t>(r)].ok()) << status[static_cast<size_t>(r)];
  return comms;
}

// Runs `op` on every rank at once; their statuses.
std::vector<absl::Status> RunAll(std::vector<std::unique_ptr<Communicator>>& comms,
                                 const std::function<OpRequest(int)>& op) {
  std::vector<absl::Status> out(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { out[r] = comms[r]->Run(op(static_cast<int>(r))); });
  }
  for (auto& t : threads) t.join();
  return out;
}

class Groups : public ::testing::TestWithParam<int> {};

TEST_P(Groups, EveryCollectiveEqualsTheSumsComputedHere) {
  const int size = GetParam();
  InMemoryStore store;
  auto comms = StartGroup(size, &store, "every-" + std::to_string(size));
  ASSERT_EQ(comms.size(), static_cast<size_t>(size));
  for (auto& c : comms) ASSERT_NE(c, nullptr);
  const int64_t n = 10007;  // not a multiple of anything
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<std::vector<float>> inputs(static_cast<size_t>(size), std::vector<float>(static_cast<size_t>(n)));
  std::vector<double> want(static_cast<size_t>(n), 0.0);
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      inputs[static_cast<size_t>(r)][static_cast<size_t>(i)] = dist(rng);
      want[static_cast<size_t>(i)] += inputs[static_cast<size_t>(r)][static_cast<size_t>(i)];
    }
  }
  auto load = [&] {
    for (int r = 0; r < size; ++r) {
      std::copy(inputs[static_cast<size_t>(r)].begin(), inputs[static_cast<size_t>(r)].end(),
                comms[static_cast<size_t>(r)]->data());
    }
  };
  // The sum of `size` floats in any order lies within a few ulps of the exact one.
  auto near = [](double got, double exact) { return std::abs(got - exact) <= 1e-6 * std::max(1.0, std::abs(exact)); };

  load();
  for (const absl::Status& st :
       RunAll(comms, [&](int) { return OpRequest{CollectiveOp::kAllReduce, 0, n, 0, 0, 10000, {}}; })) {
    ASSERT_TRUE(st.ok()) << st;
  }
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(near(comms[static_cast<size_t>(r)]->data()[i], want[static_cast<size_t>(i)]))
          << "all-reduce rank " << r << " element " << i;
    }
  }
  // Reduce-scatter into uneven blocks: rank r receives block r of the sum at out_offset.
  std::vector<int64_t> counts;
  int64_t left = n;
  for (int r = 0; r < size; ++r) {
    const int64_t c = r + 1 < size ? n / size + 3 * r + 1 : left;
    counts.push_back(c);
    left -= c;
  }
  load();
  const int64_t out = 20000 * 4;
  for (const absl::Status& st :
       RunAll(comms, [&](int) { return OpRequest{CollectiveOp::kReduceScatter, 0, n, out, 0, 10000, counts}; })) {
    ASSERT_TRUE(st.ok()) << st;
  }
  int64_t at = 0;
  for (int r = 0; r < size; ++r) {
    const float* got = comms[static_cast<size_t>(r)]->data() + out / 4;
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
      ASSERT_TRUE(near(got[i], want[static_cast<size_t>(at + i)])) << "reduce-scatter rank " << r << " element " << i;
    }
    at += counts[static_cast<size_t>(r)];
  }
  // All-gather: each rank's first 1000 inputs, in rank order, exactly.
  load();
  for (const absl::Status& st :
       RunAll(comms, [&](int) { return OpRequest{CollectiveOp::kAllGather, 0, 1000, out, 0, 10000, {}}; })) {
    ASSERT_TRUE(st.ok()) << st;
  }
  for (int r = 0; r < size; ++r) {
    const float* got = comms[static_cast<size_t>(r)]->data() + out / 4;
    for (int from = 0; from < size; ++from) {
      for (int64_t i = 0; i < 1000; ++i) {
        ASSERT_EQ(got[from * 1000 + i], inputs[static_cast<size_t>(from)][static_cast<size_t>(i)]);
      }
    }
  }
  // Broadcast from the last rank, exactly; then a barrier.
  load();
  for (const absl::Status& st :
       RunAll(comms, [&](int) { return OpRequest{CollectiveOp::kBroadcast, 0, n, 0, size - 1, 10000, {}}; })) {
    ASSERT_TRUE(st.ok()) << st;
  }
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(comms[static_cast<size_t>(r)]->data()[i],
                inputs[static_cast<size_t>(size - 1)][static_cast<size_t>(i)]);
    }
  }
  for (const absl::Status& st : RunAll(comms, [](int) { return OpRequest{}; })) ASSERT_TRUE(st.ok()) << st;
  // A request outside the buffer is refused before anything runs; the group goes on.
  EXPECT_EQ(comms[0]->Run(OpRequest{CollectiveOp::kAllReduce, 8, kFloats, 0, 0, 1000, {}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comms[0]->Run(OpRequest{CollectiveOp::kReduceScatter, 0, n, 0, 0, 1000, {n}}).code(),
            absl::StatusCode::kInvalidArgument);
  for (const absl::Status& st : RunAll(comms, [](int) { return OpRequest{}; })) ASSERT_TRUE(st.ok()) << st;
}

// Blocks of any size, empty ones included (a rank that owns nothing of a layer): reduce-scatter
// gives each rank the sum of its block, and the variable all-gather gives every rank each rank's
// block in rank order, exactly.
TEST_P(Groups, BlocksOfAnySizeIncludingEmptyOnes) {
  const int size = GetParam();
  InMemoryStore store;
  auto comms = StartGroup(size, &store, "blocks-" + std::to_string(size));
  for (auto& c : comms) ASSERT_NE(c, nullptr);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1, 1);
  const std::vector<std::vector<int64_t>> layouts = {
      std::vector<int64_t>(static_cast<size_t>(size), 0),
      [&] {
        std::vector<int64_t> c(static_cast<size_t>(size), 0);
        c[0] = 777;  // everything on rank 0
        return c;
      }(),
      [&] {
        std::vector<int64_t> c(static_cast<size_t>(size), 5);
        c[static_cast<size_t>(size - 1)] = 0;  // the last rank owns nothing
        c[0] = 3001;
        return c;
      }(),
      [&] {
        std::vector<int64_t> c(static_cast<size_t>(size), 7);
        c[0] = 0;  // the first rank owns nothing
        return c;
      }(),
      [&] {
        std::vector<int64_t> c(static_cast<size_t>(size), 2049);
        c[static_cast<size_t>(size / 2)] = 0;  // a middle one owns nothing
        c[static_cast<size_t>(size - 1)] = 13;
        return c;
      }()};
  for (const std::vector<int64_t>& counts : layouts) {
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    std::vector<std::vector<float>> in(static_cast<size_t>(size), std::vector<float>(static_cast<size_t>(n)));
    std::vector<double> want(static_cast<size_t>(n), 0.0);
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        in[static_cast<size_t>(r)][static_cast<size_t>(i)] = dist(rng);
        want[static_cast<size_t>(i)] += in[static_cast<size_t>(r)][static_cast<size_t>(i)];
      }
      std::copy(in[static_cast<size_t>(r)].begin(), in[static_cast<size_t>(r)].end(),
                comms[static_cast<size_t>(r)]->data());
    }
    const int64_t out = 20000 * 4;
    for (const absl::Status& st :
         RunAll(comms, [&](int) { return OpRequest{CollectiveOp::kReduceScatter, 0, n, out, 0, 10000, counts}; })) {
      ASSERT_TRUE(st.ok()) << st;
    }
    int64_t at = 0;
    for (int r = 0; r < size; ++r) {
      const float* got = comms[static_cast<size_t>(r)]->data() + out / 4;
      for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
        ASSERT_NEAR(got[i], want[static_cast<size_t>(at + i)], 1e-5) << "reduce-scatter rank " << r << " element " << i;
      }
      at += counts[static_cast<size_t>(r)];
    }
    // Each rank's block (its own inputs, loaded again: the reduce-scatter summed in place) at
    // offset 0, gathered at `out`.
    for (int r = 0; r < size; ++r) {
      std::copy(in[static_cast<size_t>(r)].begin(), in[static_cast<size_t>(r)].end(),
                comms[static_cast<size_t>(r)]->data());
    }
    for (const absl::Status& st :
         RunAll(comms, [&](int) { return OpRequest{CollectiveOp::kAllGatherV, 0, n, out, 0, 10000, counts}; })) {
      ASSERT_TRUE(st.ok()) << st;
    }
    for (int r = 0; r < size; ++r) {
      const float* got = comms[static_cast<size_t>(r)]->data() + out / 4;
      int64_t from_at = 0;
      for (int from = 0; from < size; ++from) {
        for (int64_t i = 0; i < counts[static_cast<size_t>(from)]; ++i) {
          ASSERT_EQ(got[from_at + i], in[static_cast<size_t>(from)][static_cast<size_t>(i)])
              << "all-gather rank " << r << " block " << from << " element " << i;
        }
        from_at += counts[static_cast<size_t>(from)];
      }
    }
  }
  // bf16 input: each rank's values rounded to bf16 cross the wire and are summed in fp32, in
  // rank order, at the output (what the test computes here, bit for bit).
  {
    const std::vector<int64_t> counts = [&] {
      std::vector<int64_t> c(static_cast<size_t>(size), 1001);
      c[0] = 0;
      return c;
    }();
    int64_t n = 0;
    for (int64_t c : counts) n += c;
    std::vector<std::vector<uint16_t>> in(static_cast<size_t>(size), std::vector<uint16_t>(static_cast<size_t>(n)));
    auto widen = [](uint16_t h) {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    };
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        const float v = dist(rng);
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        in[static_cast<size_t>(r)][static_cast<size_t>(i)] = static_cast<uint16_t>(bits >> 16);
      }
      std::memcpy(comms[static_cast<size_t>(r)]->data(), in[static_cast<size_t>(r)].data(), static_cast<size_t>(n) * 2);
    }
    const int64_t out = 20000 * 4;
    for (const absl::Status& st : RunAll(comms, [&](int) {
           OpRequest op{CollectiveOp::kReduceScatter, 0, n, out, 0, 10000, counts};
           op.bf16_input = true;
           return op;
         })) {
      ASSERT_TRUE(st.ok()) << st;
    }
    int64_t at = 0;
    for (int r = 0; r < size; ++r) {
      const float* got = comms[static_cast<size_t>(r)]->data() + out / 4;
      for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
        float want = widen(in[0][static_cast<size_t>(at + i)]);
        for (int from = 1; from < size; ++from)
          want += widen(in[static_cast<size_t>(from)][static_cast<size_t>(at + i)]);
        ASSERT_EQ(got[i], want) << "bf16 reduce-scatter rank " << r << " element " << i;
      }
      at += counts[static_cast<size_t>(r)];
    }
  }
  // Counts that do not add up are refused before anything runs.
  std::vector<int64_t> bad(static_cast<size_t>(size), 1);
  EXPECT_EQ(comms[0]->Run(OpRequest{CollectiveOp::kAllGatherV, 0, size + 1, 4096, 0, 1000, bad}).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(TwoAndThree, Groups, ::testing::Values(2, 3));

// A peer killed (or stopped) mid-group: the others' collective fails within its timeout plus
// the grace period, naming the operation and the rank; the communicator is gone after that,
// and every later call says why at once.
TEST(Communicator, AKilledOrStoppedPeerFailsTheOthersWithinTheDeadline) {
  for (const int sig : {SIGKILL, SIGSTOP}) {
    InMemoryStore store;
    auto comms = StartGroup(3, &store, "fault-" + std::to_string(sig));
    for (auto& c : comms) ASSERT_NE(c, nullptr);
    ::kill(comms[2]->pid(), sig);
    const auto t0 = Clock::now();
    std::vector<absl::Status> st(2);
    std::thread a([&] { st[0] = comms[0]->Run(OpRequest{CollectiveOp::kAllReduce, 0, 4096, 0, 0, 2000, {}}); });
    std::thread b([&] { st[1] = comms[1]->Run(OpRequest{CollectiveOp::kAllReduce, 0, 4096, 0, 0, 2000, {}}); });
    a.join();
    b.join();
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_LT(took, 2.0 + 5.0 + 2.0) << "signal " << sig;
    for (int r = 0; r < 2; ++r) {
      EXPECT_FALSE(st[static_cast<size_t>(r)].ok()) << "signal " << sig;
      EXPECT_NE(st[static_cast<size_t>(r)].message().find("all-reduce on rank " + std::to_string(r) + " of 3"),
                std::string::npos)
          << st[static_cast<size_t>(r)];
      EXPECT_FALSE(comms[static_cast<size_t>(r)]->health().ok());
      EXPECT_EQ(comms[static_cast<size_t>(r)]->Run(OpRequest{}).code(), absl::StatusCode::kFailedPrecondition);
    }
    if (sig == SIGSTOP) ::kill(comms[2]->pid(), SIGCONT);
  }
}

// A peer that never comes: Start fails after the connect timeout (plus grace), saying so.
TEST(Communicator, APeerThatNeverComesFailsTheRendezvousInTime) {
  InMemoryStore store;
  CommunicatorOptions o;
  o.binary = RP_COMM_BINARY;
  o.rank = 0;
  o.size = 2;
  o.buffer_bytes = 4096;
  o.connect_timeout = std::chrono::milliseconds(1500);
  o.group = "alone";
  const auto t0 = Clock::now();
  auto c = Communicator::Start(o, &store);
  EXPECT_FALSE(c.ok());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.5 + 5 + 2);
  EXPECT_NE(c.status().message().find("rank 0 of 2"), std::string::npos) << c.status();
  o.rank = 2;
  EXPECT_EQ(Communicator::Start(o, &store).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.buffer_bytes = 6;
  EXPECT_EQ(Communicator::Start(o, &store).status().code(), absl::StatusCode::kInvalidArgument);
  o.buffer_bytes = 4096;
  o.binary = "/nonexistent/roundpipe-comm";
  EXPECT_EQ(Communicator::Start(o, &store).status().code(), absl::StatusCode::kUnavailable);
}

// Which copy of Gloo the communicator binds: with every symbol bound at start (LD_BIND_NOW), the
// dynamic linker's record of bindings shows each gloo:: symbol bound to Debian's libgloo (or to
// the binary's own instances of its header templates), and none to LibTorch's library. The same check on the process
// with LibTorch preloaded (so its copy interposes) must see LibTorch's bindings: the check can fail.
std::vector<std::string> GlooBindingsTo(const std::string& env) {
  std::string out;
  (void)rp::testing::RunCommand(env + " LD_BIND_NOW=1 LD_DEBUG=bindings " + std::string(RP_COMM_BINARY) + " 2>&1",
                                &out);
  std::vector<std::string> targets;
  size_t at = 0;
  while ((at = out.find("binding file ", at)) != std::string::npos) {
    const size_t end = out.find('\n', at);
    const std::string line = out.substr(at, end - at);
    at = end;
    if (line.find("`_ZN4gloo") == std::string::npos && line.find("`_ZNK4gloo") == std::string::npos) continue;
    const size_t to = line.find(" to ");
    if (to == std::string::npos) continue;
    targets.push_back(line.substr(to + 4, line.find(" [", to + 4) - to - 4));
  }
  return targets;
}

TEST(Communicator, BindsDebiansGlooAndNeverLibTorchsCopy) {
  const std::vector<std::string> targets = GlooBindingsTo("");
  ASSERT_GT(targets.size(), 20u) << "no gloo:: bindings recorded";
  // Bound to Debian's library, or to the binary itself: the templates of Debian's headers it
  // instantiates (the reduce-scatter algorithm, the sum function).
  int to_libgloo = 0;
  for (const std::string& t : targets) {
    const bool gloo = t.find("libgloo.so") != std::string::npos;
    to_libgloo += gloo ? 1 : 0;
    EXPECT_TRUE(gloo || t == RP_COMM_BINARY) << "a gloo:: symbol bound to " << t;
    EXPECT_EQ(t.find("torch"), std::string::npos) << t;
  }
  EXPECT_GT(to_libgloo, 20);
  const std::vector<std::string> interposed = GlooBindingsTo(std::string("LD_PRELOAD=") + RP_TORCH_CPU_LIBRARY);
  int to_torch = 0;
  for (const std::string& t : interposed) to_torch += t.find("libtorch_cpu") != std::string::npos ? 1 : 0;
  EXPECT_GT(to_torch, 0) << "with LibTorch preloaded its gloo:: symbols must show as bound: the check would miss them";
}

}  // namespace
}  // namespace rp::workers::collective
