// Model I/O against an independent implementation: tiny Llama-3 (llama3 rope scaling) and Qwen3
// (q/k norm, tied embeddings) models made and trained by PyPI's `transformers`
// (make_hf_models.py); the engine loads them, trains the same two AdamW steps on the same tokens
// (losses, gradient norms and weights must match), and its export loads back into transformers.
// Then the corrupt-input matrix for safetensors files, shard indexes and config.json.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "absl/strings/str_join.h"
#include "scheduler/engine.h"
#include "tests/support/engine_values.h"
#include "tests/support/run_command.h"
#include "tests/unit/workers/io/hf_models_fixture.h"
#include "workers/io/hf_config.h"
#include "workers/io/hf_export.h"
#include "workers/io/hf_tensors.h"
#include "workers/io/safetensors_reader.h"
#include "workers/io/safetensors_writer.h"
#include "workers/models/test_hooks.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using rp::testing::ReadWholeFile;
using rp::testing::RunCommand;

void TrainAndCompare(const std::string& model_dir, bool expect_tied, bool expect_scaling) {
  auto cfg = files::ReadHfConfig(model_dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->tied_embeddings, expect_tied);
  EXPECT_EQ(cfg->qk_norm, expect_tied);  // the Qwen3 model is the tied one
  EXPECT_EQ(cfg->rope_scaling.factor > 0, expect_scaling);
  EXPECT_EQ(cfg->head_dim, 8);
  auto ref = SafetensorsFile::Open(model_dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  at::Tensor tokens = *(*ref)->Read("tokens", at::kLong);
  at::Tensor losses = *(*ref)->Read("losses", at::kDouble);
  at::Tensor norms = *(*ref)->Read("grad_norms", at::kDouble);

  auto engine = scheduler::Engine::Create({"cpu:2"});
  ASSERT_TRUE(engine.ok());
  scheduler::JobSpec spec;
  spec.model = *cfg;
  spec.hf_dir = model_dir;
  spec.precision = scheduler::Precision::kFloat32;
  spec.optimizer.lr = 1e-3;
  spec.optimizer.weight_decay = 0;
  spec.optimizer.eps = 1e-8;
  spec.microbatches = 2;
  auto id = (*engine)->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(tokens)).ok());
  ASSERT_TRUE((*engine)->FeedBatch(*id, rp::testing::ToBatch(tokens)).ok());
  ASSERT_TRUE((*engine)->CloseInput(*id).ok());
  std::vector<scheduler::IterationStats> stats;
  for (int i = 0; i < 300 && *(*engine)->State(*id) != scheduler::JobState::kSucceeded; ++i) {
    auto ev = (*engine)->AwaitEvents(*id, 100ms);
    for (const auto& e : *ev) {
      if (e.kind == scheduler::JobEvent::Kind::kIteration) stats.push_back(e.stats);
    }
  }
  auto rest = (*engine)->AwaitEvents(*id, 0ms);  // named: a temporary StatusOr would dangle
  for (const auto& e : *rest) {
    if (e.kind == scheduler::JobEvent::Kind::kIteration) stats.push_back(e.stats);
  }
  ASSERT_EQ(stats.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_NEAR(stats[s].loss, losses[s].item<double>(), 2e-5) << "loss of step " << s + 1;
    EXPECT_NEAR(stats[s].grad_norm, norms[s].item<double>(), 1e-4 * norms[s].item<double>())
        << "gradient norm of step " << s + 1;
  }
  // Weights after the two AdamW steps equal transformers + torch.optim.AdamW's.
  auto shapes = (*engine)->ParameterShapes(*id);
  ASSERT_TRUE(shapes.ok());
  for (const auto& [name, shape] : *shapes) {
    at::Tensor want = *(*ref)->Read("after." + name, at::kFloat);
    at::Tensor got = rp::testing::ParameterTensor(**engine, *id, name);
    EXPECT_TRUE(at::allclose(got, want, 1e-4, 2e-6)) << name << " max diff " << (got - want).abs().max().item<float>();
  }
  // Export (fp32, two shards to exercise the index) and load it back with transformers.
  const std::string out = model_dir + "-export";
  HfExportOptions o;
  o.dtype = at::kFloat;
  o.shard_bytes = 40 * 1024;
  auto bytes =
      ExportHfModel(out, *cfg, rp::testing::NamedShapes(*shapes), rp::testing::ParameterFetch(**engine, *id), o);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  std::string log;
  EXPECT_EQ(
      RunCommand(std::string(RP_VENV_PYTHON) + " " RP_TEST_DIR "/make_hf_models.py --check " + out + " " + model_dir,
                 &log),
      0)
      << log;
  // And back into the engine: the exported directory loads and holds the trained weights.
  HostModelStore again(*cfg, at::kFloat, 99);
  ASSERT_TRUE(LoadHfWeights(out, &again).ok());
  const int q = again.FindParam("model.layers.1.self_attn.q_proj.weight");
  EXPECT_TRUE(at::equal(again.param(q).fp32,
                        rp::testing::ParameterTensor(**engine, *id, "model.layers.1.self_attn.q_proj.weight")));
}

TEST_F(HfModels, Llama3WithRopeScalingMatchesTransformers) { TrainAndCompare(dir_ + "/llama", false, true); }
TEST_F(HfModels, Qwen3WithTiedEmbeddingsMatchesTransformers) { TrainAndCompare(dir_ + "/qwen3", true, false); }

// Qwen3-MoE (six experts, top-2, renormalised; block 1 dense by mlp_only_layers) from the hub's
// layout, against transformers' own model: losses, gradient norms and every weight after two
// AdamW steps, on one and three CPU workers, with partitions that cut between the sparse blocks
// (one layer per slot too), sync and async (staleness 1: both steps apply the first gradient).
// Then the export: hub layout again, loaded by transformers with equal weights.
TEST_F(HfModels, Qwen3MoeTrainsLikeTransformersOnEveryPartitionAndMode) {
  const std::string dir = dir_ + "/qwen3moe";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->num_experts, 6);
  EXPECT_EQ(cfg->experts_per_token, 2);
  EXPECT_TRUE(cfg->norm_topk_prob);
  EXPECT_TRUE(cfg->SparseBlock(0));
  EXPECT_FALSE(cfg->SparseBlock(1));
  EXPECT_TRUE(cfg->SparseBlock(2));
  struct Case {
    std::string devices;
    planning::Partition partition;
  };
  const std::vector<Case> cases = {
      {"cpu:1", {{3}, 2, {3}}},
      {"cpu:1", {{2, 1}, 2, {1, 2}}},
      {"cpu:3", {{2, 1}, 2, {1, 2}}},
      {"cpu:3", {{1, 1, 1, 1}, 1, {1, 1, 1, 1}}},
  };
  for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
    const bool async = mode == planning::OptimizerMode::kAsync;
    auto ref = SafetensorsFile::Open(dir + (async ? "/reference_async.safetensors" : "/reference.safetensors"));
    ASSERT_TRUE(ref.ok()) << ref.status();
    const at::Tensor tokens = *(*ref)->Read("tokens", at::kLong);
    for (const Case& c : cases) {
      SCOPED_TRACE(c.devices + " " + c.partition.ToString() + (async ? " async" : " sync"));
      MoeRun run = RunTwoSteps(*cfg, dir, c.devices, c.partition, mode, tokens);
      ExpectTrainedLikeReference(run, **ref, c.partition, async, 4);
      if (c.devices != "cpu:3" || async) continue;
      // Export in the hub's layout (two shards, experts one by one); transformers and our loader
      // read it back.
      const std::string out = dir + "-export-" + std::to_string(c.partition.num_stages());
      ExpectExportLoadsInTransformers(run, *cfg, out, "model.layers.2.mlp.experts.gate_up_proj");
      auto index = ReadWholeFile(out + "/model.safetensors.index.json");
      EXPECT_NE(index.find("model.layers.2.mlp.experts.5.up_proj.weight"), std::string::npos);
      EXPECT_EQ(index.find("gate_up_proj"), std::string::npos);
    }
  }
}

// The router's auxiliary loss (config.json: output_router_logits true, coefficient 0.05), per
// micro-batch with its gradient, against transformers' load_balancing_loss_func on each
// micro-batch's forward: on one and three workers, sync and async (staleness 1), with B_1 holding
// a sparse block or none (the other blocks' aux gradients then reach them in recomputing backward
// stages). And off when the job says so: the first step's loss is the reference's minus the aux
// term.
TEST_F(HfModels, Qwen3MoeRouterAuxLossTrainsLikeTransformers) {
  const std::string dir = dir_ + "/qwen3moe_aux";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_DOUBLE_EQ(cfg->router_aux_loss_coef, 0.05);
  auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto ref_async = SafetensorsFile::Open(dir + "/reference_async.safetensors");
  ASSERT_TRUE(ref_async.ok()) << ref_async.status();
  const at::Tensor tokens = *(*ref)->Read("tokens", at::kLong);
  for (const auto& [devices, partition] : std::vector<std::pair<std::string, planning::Partition>>{
           {"cpu:1", {{3}, 2, {3}}}, {"cpu:3", {{2, 1}, 2, {1, 2}}}, {"cpu:3", {{1, 1, 1, 1}, 1, {1, 1, 1, 1}}}}) {
    for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
      const bool async = mode == planning::OptimizerMode::kAsync;
      SCOPED_TRACE(devices + " " + partition.ToString() + (async ? " async" : " sync"));
      const MoeRun run = RunTwoSteps(*cfg, dir, devices, partition, mode, tokens);
      ExpectTrainedLikeReference(run, async ? **ref_async : **ref, partition, async, 4);
    }
  }
  spec::ModelConfig off = *cfg;
  off.router_aux_loss_coef = 0;
  const MoeRun run = RunTwoSteps(off, dir, "cpu:1", {{3}, 2, {3}}, planning::OptimizerMode::kSync, tokens);
  ASSERT_EQ(run.stats.size(), 2u);
  const double with_aux = (*(*ref)->Read("losses", at::kDouble))[0].item<double>();
  const double aux = (*(*ref)->Read("aux_losses", at::kDouble))[0].item<double>();
  EXPECT_GT(aux, 0.05);
  EXPECT_NEAR(run.stats[0].loss, with_aux - aux, 2e-5);
}

// Recompute fidelity (ARCHITECTURE §10). qwen3moe_ties routes each token to one of four experts, and
// for about a fifth of the tokens experts 0 and 1 are closer than bf16 can tell. A hook makes
// every router that runs with autograd — a backward stage's recompute, or the fused B_1 — select
// on bf16-rounded probabilities, as a lower-precision re-run of the router would: it flips those
// tokens to the other expert. Forward stages (no autograd) route in fp32 as transformers does.
//   - One layer per slot and a head-only B_1: every sparse block is recomputed, and the replayed
//     routing keeps the gradients, the steps and the weights transformers'.
//   - The control: B_1 holding both sparse blocks routes live under the hook and must be off,
//     which proves the hook flips routes that matter (without replay the first case is as off:
//     checked by disabling the replay).
TEST_F(HfModels, RecomputeReplaysTheForwardsRoutingWhereARerunWouldRouteOtherwise) {
  const std::string dir = dir_ + "/qwen3moe_ties";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  ASSERT_EQ(cfg->experts_per_token, 1);
  auto ref = SafetensorsFile::Open(dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status();
  const at::Tensor tokens = *(*ref)->Read("tokens", at::kLong);
  const at::Tensor losses = *(*ref)->Read("losses", at::kDouble);
  const at::Tensor norms = *(*ref)->Read("grad_norms", at::kDouble);
  const models::RouterSelectionHook bf16_under_autograd = [](const at::Tensor& probs) {
    return at::GradMode::is_enabled() ? probs.to(at::kBFloat16).to(at::kFloat) : probs;
  };
  models::SetRouterSelectionHookForTest(&bf16_under_autograd);
  // The step-1 gradient norm and the weights after two steps, within the MoE test's tolerances.
  auto off_reference = [&](const MoeRun& run) {
    std::vector<std::string> off;
    if (run.stats.size() != 2) return std::vector<std::string>{"iterations"};
    if (std::abs(run.stats[0].loss - losses[0].item<double>()) > 2e-5) off.push_back("loss");
    if (std::abs(run.stats[0].grad_norm - norms[0].item<double>()) > 1e-4 * norms[0].item<double>()) {
      off.push_back("grad_norm " + std::to_string(run.stats[0].grad_norm));
    }
    const auto shapes = run.engine->ParameterShapes(run.id);  // named: a temporary would dangle
    if (!shapes.ok()) return std::vector<std::string>{shapes.status().ToString()};
    for (const auto& [name, shape] : *shapes) {
      const at::Tensor want = *(*ref)->Read("after." + name, at::kFloat);
      const at::Tensor got = rp::testing::ParameterTensor(*run.engine, run.id, name);
      if (!at::allclose(got, want, 1e-4, 4e-4)) off.push_back(name);
    }
    return off;
  };
  const MoeRun replayed =
      RunTwoSteps(*cfg, dir, "cpu:3", {{1, 1, 1}, 1, {1, 1, 1}}, planning::OptimizerMode::kSync, tokens);
  const MoeRun live = RunTwoSteps(*cfg, dir, "cpu:1", {{1}, 3, {1}}, planning::OptimizerMode::kSync, tokens);
  models::SetRouterSelectionHookForTest(nullptr);
  const std::vector<std::string> replayed_off = off_reference(replayed);
  EXPECT_TRUE(replayed_off.empty()) << absl::StrJoin(replayed_off, ", ");
  const std::vector<std::string> live_off = off_reference(live);
  EXPECT_GE(live_off.size(), 3u) << absl::StrJoin(live_off, ", ");  // gradients and expert weights
}

// A broken Qwen3-MoE directory is refused naming what to fix: top-k above the experts, a missing
// expert tensor, a misshapen one.
TEST_F(HfModels, BrokenQwen3MoeDirectoriesAreRefusedNamingTheFieldOrTensor) {
  const std::string dir = dir_ + "/qwen3moe";
  auto cfg = files::ReadHfConfig(dir);
  ASSERT_TRUE(cfg.ok());
  std::string text = ReadWholeFile(dir + "/config.json");
  const std::string key = "\"num_experts_per_tok\": 2";
  ASSERT_NE(text.find(key), std::string::npos) << text;
  std::string bad = text;
  bad.replace(bad.find(key), key.size(), "\"num_experts_per_tok\": 9");
  auto parsed = files::ParseHfConfig(bad);
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("num_experts_per_tok 9 is above num_local_experts 6"), std::string::npos)
      << parsed.status();
  bad = text;
  const std::string router = "\"output_router_logits\": false";
  ASSERT_NE(bad.find(router), std::string::npos);
  bad.replace(bad.find(router), router.size(), "\"output_router_logits\": true");
  EXPECT_DOUBLE_EQ(files::ParseHfConfig(bad)->router_aux_loss_coef, 0.001);  // Qwen3MoeConfig's default
  const std::string coef = "\"router_aux_loss_coef\": 0.001";
  ASSERT_NE(bad.find(coef), std::string::npos);
  bad.replace(bad.find(coef), coef.size(), "\"router_aux_loss_coef\": -1");
  EXPECT_NE(files::ParseHfConfig(bad).status().message().find("router_aux_loss_coef must be a finite number >= 0"),
            std::string::npos);
  bad.replace(bad.find("\"router_aux_loss_coef\": -1"), 26, "\"router_aux_loss_coef\": 0");
  EXPECT_DOUBLE_EQ(files::ParseHfConfig(bad)->router_aux_loss_coef, 0);  // on, but adding nothing: off
  // Weights: rewrite the file without one expert's up projection, then with a misshapen down.
  auto file = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  for (int variant = 0; variant < 2; ++variant) {
    const std::string broken = dir_ + "/qwen3moe-broken-" + std::to_string(variant);
    fs::create_directories(broken);
    fs::copy_file(dir + "/config.json", broken + "/config.json", fs::copy_options::overwrite_existing);
    std::vector<TensorDecl> decls;
    std::vector<at::Tensor> values;
    for (const auto& t : (*file)->tensors()) {
      at::Tensor v = *(*file)->Read(t.name, at::kFloat);
      if (variant == 0 && t.name == "model.layers.2.mlp.experts.3.up_proj.weight") continue;
      if (variant == 1 && t.name == "model.layers.0.mlp.experts.1.down_proj.weight")
        v = v.narrow(1, 0, 15).contiguous();
      decls.push_back({t.name, at::kFloat, v.sizes().vec()});
      values.push_back(v);
    }
    SafetensorsWriter w;
    ASSERT_TRUE(w.Open(broken + "/model.safetensors", decls).ok());
    for (const at::Tensor& v : values) ASSERT_TRUE(w.Add(v).ok());
    ASSERT_TRUE(w.Finish().ok());
    const absl::Status st = CheckHfWeights(broken, *cfg);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(variant == 0 ? "model.layers.2.mlp.experts.3.up_proj.weight"
                                             : "model.layers.0.mlp.experts.1.down_proj.weight"),
              std::string::npos)
        << st;
  }
}

// ---------------------------------------------------------------- corrupt inputs

std::string WriteBytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

std::string Safetensors(const std::string& header, size_t data_bytes, uint64_t claimed_len = 0) {
  const uint64_t n = claimed_len ? claimed_len : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsCorrupt, EveryDefectIsACleanError) {
  const fs::path d = fs::temp_directory_path() / ("rp_st_corrupt_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string good = R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})";
  ASSERT_TRUE(SafetensorsFile::Open(WriteBytes(d / "good.st", Safetensors(good, 16))).ok());
  struct Case {
    std::string what, bytes, needle;
  };
  const std::vector<Case> cases = {
      {"empty file", "", "truncated"},
      {"truncated header length", std::string("\x05\x00\x00", 3), "truncated"},
      {"header length beyond the file", Safetensors(good, 16, 1 << 20), "beyond the file"},
      {"truncated data", Safetensors(good, 8), "outside the 8 data bytes"},
      {"not JSON", Safetensors("{\"a\": ", 0), "not valid JSON"},
      {"not an object", Safetensors("[1, 2]", 0), "not a JSON object"},
      {"unknown dtype", Safetensors(R"({"a": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}})", 1),
       "unsupported dtype"},
      {"negative shape", Safetensors(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
       "non-negative"},
      {"offsets reversed", Safetensors(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4),
       "outside"},
      {"offsets vs shape", Safetensors(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8),
       "the shape needs 12"},
      {"overlap",
       Safetensors(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                   12),
       "overlap"},
      {"missing offsets", Safetensors(R"({"a": {"dtype": "F32", "shape": [2]}})", 8), "data_offsets"},
      {"huge shape",
       Safetensors(R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 8], "data_offsets": [0, 8]}})", 8),
       "shape too large"},
  };
  for (const Case& c : cases) {
    auto f = SafetensorsFile::Open(WriteBytes(d / "bad.st", c.bytes));
    ASSERT_FALSE(f.ok()) << c.what;
    EXPECT_NE(f.status().message().find(c.needle), std::string::npos) << c.what << ": " << f.status();
  }
  EXPECT_EQ(SafetensorsFile::Open((d / "missing.st").string()).status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(d);
}

TEST(HfDirCorrupt, ConfigAndShardDefectsAreCleanErrors) {
  const fs::path d = fs::temp_directory_path() / ("rp_hf_corrupt_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  spec::ModelConfig c;
  c.family = "llama";
  c.vocab = 16;
  c.hidden = 8;
  c.intermediate = 16;
  c.num_blocks = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  HostModelStore store(c, at::kFloat, 1);
  std::vector<NamedShape> shapes;
  for (int i = 0; i < store.num_params(); ++i) shapes.emplace_back(store.param(i).name, store.param(i).shape);
  auto fetch = [&](const std::string& n) -> absl::StatusOr<at::Tensor> { return store.param(store.FindParam(n)).fp32; };
  HfExportOptions two_shards;
  two_shards.dtype = at::kFloat;
  two_shards.shard_bytes = 600;
  ASSERT_TRUE(ExportHfModel((d / "m").string(), c, shapes, fetch, two_shards).ok());
  {  // round trip within the engine
    HostModelStore back(c, at::kFloat, 2);
    ASSERT_TRUE(LoadHfWeights((d / "m").string(), &back).ok());
    EXPECT_TRUE(at::equal(back.param(1).fp32, store.param(1).fp32));
  }
  // Config.json defects.
  for (const auto& [json, needle] : std::vector<std::pair<std::string, std::string>>{
           {"{", "not a JSON object"},
           {R"({"model_type": "gpt2"})", "not supported"},
           {R"({"model_type": "llama", "hidden_size": 8})", "missing vocab_size"},
           {R"({"model_type": "llama", "vocab_size": 16, "hidden_size": -8, "intermediate_size": 16,
                "num_hidden_layers": 1, "num_attention_heads": 2})",
            "hidden_size must be a positive integer"},
           {R"({"model_type": "qwen2", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
                "num_hidden_layers": 1, "num_attention_heads": 2})",
            "attention biases"},
           {R"({"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
                "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"rope_type": "dynamic"}})",
            "not supported"}}) {
    auto r = files::ParseHfConfig(json);
    ASSERT_FALSE(r.ok()) << json;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << json << ": " << r.status();
  }
  // Shape mismatch with config.json: a model with a different width.
  spec::ModelConfig wider = c;
  wider.intermediate = 24;
  HostModelStore mismatch(wider, at::kFloat, 3);
  auto st = LoadHfWeights((d / "m").string(), &mismatch);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("config.json implies"), std::string::npos) << st;
  // A missing shard.
  std::string shard;
  for (const auto& e : fs::directory_iterator(d / "m")) {
    if (e.path().filename().string().rfind("model-0000", 0) == 0) shard = e.path().filename().string();
  }
  ASSERT_FALSE(shard.empty());
  fs::remove(d / "m" / shard);
  st = LoadHfWeights((d / "m").string(), &store);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(shard), std::string::npos) << st;
  // A shard name that escapes the directory.
  std::ofstream(d / "m" / "model.safetensors.index.json") << R"({"weight_map": {"x": "../evil.safetensors"}})";
  st = LoadHfWeights((d / "m").string(), &mismatch);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("must be a file in the model dir"), std::string::npos) << st;
  fs::remove_all(d);
}

}  // namespace
}  // namespace rp::workers::io
