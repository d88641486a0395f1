// The ZeRO-1 exchanges of a data-parallel group (workers/data_parallel.h) on 2 and 3 real
// communicator processes: ReduceToOwners leaves each parameter's sum over the nodes in its
// owner's tensors (and the others' as they were), GatherFromOwners gives every node the owner's
// tensors exactly — with parameters larger than the shared buffer, owners that hold nothing of a
// call, and calls interleaved with the control sums, as the asynchronous optimizer makes them.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "workers/data_parallel.h"

namespace rp::workers {
namespace {

class Exchanges : public ::testing::TestWithParam<int> {};

TEST_P(Exchanges, OwnersReceiveTheSumsAndEveryNodeTheirWeights) {
  const int k = GetParam();
  // Parameter sizes: some larger than the buffer (4096 floats), some tiny, one empty-owner case.
  const std::vector<int64_t> sizes = {5000, 3, 17, 9000, 64, 1, 2500, 700, 11};
  spec::InMemoryStore store;
  std::vector<std::shared_ptr<DataParallelGroup>> groups(static_cast<size_t>(k));
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < k; ++r) {
      threads.emplace_back([&, r] {
        DataParallelOptions o;
        o.rank = r;
        o.size = k;
        o.group = "exchanges-" + std::to_string(k);
        o.binary = RP_COMM_BINARY;
        o.buffer_bytes = 4096 * 4;
        o.timeout = std::chrono::seconds(20);
        auto g = DataParallelGroup::Start(o, &store);
        ASSERT_TRUE(g.ok()) << g.status();
        (*g)->AssignOwners(sizes);
        groups[static_cast<size_t>(r)] = *g;
      });
    }
    for (auto& t : threads) t.join();
  }
  for (auto& g : groups) ASSERT_NE(g, nullptr);
  // Every node's tensors: node r's parameter i filled from seed (r, i).
  auto make = [&](int r) {
    std::vector<at::Tensor> t;
    for (size_t i = 0; i < sizes.size(); ++i) {
      at::manual_seed(static_cast<uint64_t>(100 * r + static_cast<int>(i)));
      t.push_back(at::randn({sizes[i]}, at::kFloat));
    }
    return t;
  };
  std::vector<std::vector<at::Tensor>> mine, before;
  for (int r = 0; r < k; ++r) {
    mine.push_back(make(r));
    std::vector<at::Tensor> copy;
    for (const at::Tensor& t : mine.back()) copy.push_back(t.clone());
    before.push_back(copy);
  }
  // Calls in "layers" of a few parameters each (the asynchronous optimizer's order), each
  // followed by a control sum on the same group.
  const std::vector<std::vector<int>> layers = {{8, 7, 6}, {5}, {4, 3, 2}, {1, 0}};
  auto run_all = [&](const std::function<absl::Status(int)>& call) {
    std::vector<absl::Status> st(static_cast<size_t>(k));
    std::vector<std::thread> threads;
    for (int r = 0; r < k; ++r) threads.emplace_back([&, r] { st[static_cast<size_t>(r)] = call(r); });
    for (auto& t : threads) t.join();
    for (const absl::Status& s : st) ASSERT_TRUE(s.ok()) << s;
  };
  auto lists = [&](int r, const std::vector<int>& params) {
    std::vector<std::vector<at::Tensor>> l;
    for (int i : params) l.push_back({mine[static_cast<size_t>(r)][static_cast<size_t>(i)]});
    return l;
  };
  for (const std::vector<int>& layer : layers) {
    run_all([&](int r) {
      if (absl::Status s = groups[static_cast<size_t>(r)]->ReduceToOwners(layer, lists(r, layer)); !s.ok()) return s;
      return groups[static_cast<size_t>(r)]->SumFloats({1.0}, /*on_grads=*/true).status();
    });
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    at::Tensor sum = at::zeros({sizes[i]}, at::kFloat);
    for (int r = 0; r < k; ++r) sum += before[static_cast<size_t>(r)][i];
    const int owner = groups[0]->Owner(static_cast<int>(i));
    for (int r = 0; r < k; ++r) {
      const at::Tensor& got = mine[static_cast<size_t>(r)][i];
      if (r == owner) {
        EXPECT_TRUE(at::allclose(got, sum, 1e-5, 1e-6)) << "parameter " << i << " on its owner " << r;
      } else {
        EXPECT_TRUE(at::equal(got, before[static_cast<size_t>(r)][i])) << "parameter " << i << " changed on " << r;
      }
    }
  }
  // The owners' values (the sums, a stand-in for stepped weights) to every node, exactly.
  for (const std::vector<int>& layer : layers) {
    run_all([&](int r) { return groups[static_cast<size_t>(r)]->GatherFromOwners(layer, lists(r, layer)); });
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int owner = groups[0]->Owner(static_cast<int>(i));
    for (int r = 0; r < k; ++r) {
      EXPECT_TRUE(at::equal(mine[static_cast<size_t>(r)][i], mine[static_cast<size_t>(owner)][i]))
          << "parameter " << i << " on node " << r << " (owner " << owner << ")";
    }
  }
  // Each node put every parameter's elements into the reduce-scatter and the all-gather.
  int64_t all = 0;
  for (int64_t n : sizes) all += n;
  EXPECT_GE(groups[0]->traffic().bytes, 2 * all * 4);
}

INSTANTIATE_TEST_SUITE_P(TwoAndThree, Exchanges, ::testing::Values(2, 3));

}  // namespace
}  // namespace rp::workers
