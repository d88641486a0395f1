// The profile file: what ProfileJson writes ParseProfile reads back exactly (times as doubles,
// bytes, kinds, the activation hop); bad files are refused naming the field and the layer; a
// replayed profile simulates exactly like the cost model it came from.
#include "scheduler/planning/profile_file.h"

#include <gtest/gtest.h>

#include "scheduler/planning/comparison.h"

namespace rp::planning {
namespace {

TEST(ProfileFile, RoundTripsExactly) {
  Profile p;
  p.name = "synthetic, 12 layers";
  p.costs = SyntheticCostModel(12, 3.5);
  p.costs.layers[3].fwd_s = 1.0 / 3;  // not representable in a short decimal
  p.costs.layers[3].act_bytes_per_token = 123456789;
  p.costs.tokens_per_microbatch = 8192;
  p.costs.boundary_bytes_per_token = 4096;
  p.activation_hop_s = 0.00125;
  auto back = ParseProfile(ProfileJson(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, p.name);
  EXPECT_EQ(back->activation_hop_s, p.activation_hop_s);
  EXPECT_EQ(back->costs.tokens_per_microbatch, 8192);
  EXPECT_EQ(back->costs.boundary_bytes_per_token, 4096);
  ASSERT_EQ(back->costs.num_layers(), 12);
  for (int l = 0; l < 12; ++l) {
    const LayerCost &a = p.costs.layers[static_cast<size_t>(l)], &b = back->costs.layers[static_cast<size_t>(l)];
    EXPECT_EQ(a.kind, b.kind) << l;
    EXPECT_EQ(a.fwd_s, b.fwd_s) << l;
    EXPECT_EQ(a.bwd_s, b.bwd_s) << l;
    EXPECT_EQ(a.fused_s, b.fused_s) << l;
    EXPECT_EQ(a.param_bytes, b.param_bytes) << l;
    EXPECT_EQ(a.trainable_bytes, b.trainable_bytes) << l;
    EXPECT_EQ(a.act_bytes_per_token, b.act_bytes_per_token) << l;
    EXPECT_EQ(a.fixed_work_bytes, b.fixed_work_bytes) << l;
  }
  // Replayed, it simulates like the cost model it was written from.
  ComparisonOptions o;
  o.num_workers = 3;
  o.num_microbatches = 6;
  o.schedules = {"roundpipe-sync", "1f1b"};
  auto a = CompareSchedules(p.costs, o), b = CompareSchedules(back->costs, o);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_EQ((*a)[i].bubbles.period_s, (*b)[i].bubbles.period_s);
  // Without the hop the field is absent and reads back as "not measured".
  p.activation_hop_s = -1;
  EXPECT_EQ(ProfileJson(p).find("activation_hop_s"), std::string::npos);
  EXPECT_LT(ParseProfile(ProfileJson(p))->activation_hop_s, 0);
}

TEST(ProfileFile, BadFilesNameTheField) {
  const std::string layer = R"({"kind": "block", "forward_s": 1, "backward_s": 3, "fused_s": 4})";
  auto with = [&](const std::string& layers, const std::string& extra = "") {
    return R"({"format": "roundpipe.profile.v1", )" + extra + R"("layers": [)" + layers + "]}";
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "not a JSON object"},
      {R"({"format": "roundpipe.profile.v0", "layers": []})", "\"format\""},
      {with(""), "\"layers\" must be a non-empty array"},
      {with(layer + R"(, {"kind": "block", "forward_s": 1, "fused_s": 4})"), "layer 1 has no \"backward_s\""},
      {with(R"({"kind": "block", "forward_s": -1, "backward_s": 3, "fused_s": 4})"), "layer 0 \"forward_s\""},
      {with(R"({"kind": "block", "forward_s": "1", "backward_s": 3, "fused_s": 4})"), "layer 0 \"forward_s\""},
      {with(R"({"kind": "expert", "forward_s": 1, "backward_s": 3, "fused_s": 4})"), "embedding, block or head"},
      {with(R"({"forward_s": 1, "backward_s": 3, "fused_s": 4, "param_bytes": 1.5})"), "\"param_bytes\""},
      {with(layer, R"("activation_hop_s": -2, )"), "\"activation_hop_s\""},
      {with(layer, R"("tokens_per_microbatch": -8, )"), "\"tokens_per_microbatch\""},
  };
  for (const auto& [text, needle] : cases) {
    auto p = ParseProfile(text);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status() << " lacks " << needle;
  }
  EXPECT_TRUE(ParseProfile(with(layer)).ok());
}

}  // namespace
}  // namespace rp::planning
