// One model description, one parameter count: the planner's arithmetic on spec::ModelConfig
// equals the engine's parameter layout (workers::models::ModelParams) and a real store's bytes,
// for every preset the engine runs, full fine-tuning and LoRA; every preset validates, and the
// description refuses what the engine cannot run by name.
#include "scheduler/runtime/model_adapter.h"

#include <gtest/gtest.h>

#include <cmath>

#include "scheduler/engine.h"
#include "scheduler/planning/host_state.h"
#include "scheduler/planning/presets.h"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/job_builder.h"
#include "workers/device/device.h"
#include "workers/models/layers.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler::runtime {
namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A tiny Qwen3-MoE with dense blocks among the sparse ones: blocks 1 and 3 would be sparse
// (decoder_sparse_step 2), block 3 is dense by mlp_only_layers.
spec::ModelConfig TinyMoe() {
  spec::ModelConfig m;
  m.name = "tiny-moe";
  m.family = "qwen3";
  m.vocab = 61;
  m.hidden = 32;
  m.intermediate = 48;
  m.num_blocks = 5;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 8;
  m.qk_norm = true;
  m.num_experts = 6;
  m.experts_per_token = 2;
  m.expert_intermediate = 16;
  m.decoder_sparse_step = 2;
  m.mlp_only_layers = {3};
  return m;
}

std::vector<spec::ModelConfig> EngineModels() {
  std::vector<spec::ModelConfig> out;
  spec::ModelConfig moe = TinyMoe();
  EXPECT_EQ(moe.SparseBlockCount(), 1);
  out.push_back(moe);
  moe.lora.rank = 4;
  moe.lora.targets = {"q_proj", "v_proj"};
  out.push_back(moe);
  for (const std::string& name : planning::ModelPresetNames()) {
    spec::ModelConfig m = *planning::ModelPreset(name);
    m.lora.rank = 0;
    if (m.is_moe()) {  // the MoE presets: full, attention adapters, adapters on the experts too
      out.push_back(m);
      m.lora.rank = 8;
      m.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
      out.push_back(m);
      m.lora.targets = {"q_proj", "experts.gate_up_proj", "experts.down_proj"};
      out.push_back(m);
      continue;
    }
    out.push_back(m);
    m.lora.rank = 8;
    m.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    out.push_back(m);
    m.lora.targets = {"v_proj", "down_proj"};
    out.push_back(m);
  }
  return out;
}

TEST(ModelLayout, ThePlannersParameterCountIsTheEnginesLayout) {
  for (const spec::ModelConfig& m : EngineModels()) {
    ASSERT_TRUE(m.Validate().ok()) << m.name << ": " << m.Validate();
    const spec::ModelConfig* c = &m;
    int64_t base = 0, adapters = 0;
    for (const auto& p : workers::models::ModelParams(*c)) {
      (p.name.find(".lora_") != std::string::npos ? adapters : base) += Numel(p.shape);
    }
    EXPECT_EQ(m.TotalParams(), base) << m.name << " lora " << m.lora.rank;
    EXPECT_EQ(m.LoraParams(), adapters) << m.name << " lora " << m.lora.rank;
    for (int l = 1; l <= m.num_blocks; l += std::max(1, m.num_blocks - 1)) {
      int64_t layer = 0;
      for (const auto& p : workers::models::LayerParams(*c, l)) layer += Numel(p.shape);
      EXPECT_EQ(m.LayerParams(l), layer) << m.name << " block " << l;
    }
  }
}

TEST(ModelLayout, HostStateBytesIsWhatAStoreAndItsMomentsTake) {
  for (const char* name : {"llama-tiny", "qwen3-tiny", "gpt-oss-tiny"}) {
    for (int rank : {0, 4}) {
      spec::ModelConfig m = *planning::ModelPreset(name);
      m.lora.rank = rank;
      for (auto [precision, bytes] : {std::pair{at::kFloat, 4}, std::pair{at::kBFloat16, 2}}) {
        workers::HostModelStore store(m, precision, 1);
        int64_t trainable = 0;
        for (int i = 0; i < store.num_params(); ++i) {
          if (store.param(i).fp32.defined()) trainable += store.param(i).fp32.numel();
        }
        EXPECT_EQ(planning::HostStateBytes(m, {.master_bytes = bytes}), store.HostBytes() + 8 * trainable)
            << name << " rank " << rank << " master bytes " << bytes;
      }
    }
  }
}

// Admission's arithmetic is what a job really holds once it stepped: the store (fp32 copies,
// masters, gradients, the async optimizer's gradient copies) plus the optimizer's moments, for
// full fine-tuning and LoRA, sync and async, AdamW with fp32 and bf16 moments, SGD with
// momentum and Lion (one buffer), Adafactor (factored row and column variances), and a LoRA base that is
// mapped (the store adopts views: stand-ins for a model file's tensors) rather than allocated.
TEST(ModelLayout, HostStateBytesIsWhatAJobHoldsAfterAStep) {
  // 10 and 12: the tiny Qwen3-MoE model, full and LoRA rank 2; 20 and 22: GPT-OSS's tiny preset
  // (biases: vectors and [E, n] matrices Adafactor factors).
  for (int rank : {0, 2, 10, 12, 20, 22}) {
    for (auto mode : {planning::OptimizerMode::kSync, planning::OptimizerMode::kAsync}) {
      // AdamW, AdamW bf16 moments, SGD momentum, Lion, Adafactor (factored: rows + columns per matrix)
      for (int optimizer = 0; optimizer < 5; ++optimizer) {
        const bool bf16_moments = optimizer == 1;
        for (bool mapped : {false, true}) {
          if (mapped && rank % 10 == 0) continue;
          SCOPED_TRACE(::testing::Message() << "rank " << rank << " async " << (mode == planning::OptimizerMode::kAsync)
                                            << " optimizer " << optimizer << " mapped " << mapped);
          JobSpec spec;
          spec.model = rank >= 20   ? *planning::ModelPreset("gpt-oss-tiny")
                       : rank >= 10 ? TinyMoe()
                                    : *planning::ModelPreset("llama-tiny");
          spec.model.lora.rank = rank % 10;
          spec.precision = Precision::kBFloat16;
          spec.optimizer_mode = mode;
          spec.optimizer.bf16_moments = bf16_moments;
          if (optimizer == 2) {
            spec.optimizer.algorithm = spec::OptimizerAlgorithm::kSgd;
            spec.optimizer.momentum = 0.9;
          }
          if (optimizer == 3) spec.optimizer.algorithm = spec::OptimizerAlgorithm::kLion;
          if (optimizer == 4) spec.optimizer.algorithm = spec::OptimizerAlgorithm::kAdafactor;
          spec.hf_dir = mapped ? "model-dir" : "";
          ASSERT_TRUE(spec.model.Validate().ok());
          const spec::ModelConfig* cfg = &spec.model;
          workers::Timeline tl;
          auto devs = workers::CreateDevices("cpu:2", &tl);
          ASSERT_TRUE(devs.ok());
          std::vector<workers::Device*> raw = {(*devs)[0].get(), (*devs)[1].get()};
          workers::HostModelStore store(*cfg, at::kBFloat16, 5, 0.02,
                                        mapped ? workers::FrozenInit::kDeferred : workers::FrozenInit::kRandom);
          for (int i = 0; mapped && i < store.num_params(); ++i) {
            if (!store.param(i).trainable) {
              ASSERT_TRUE(store.AdoptMappedMaster(i, at::zeros(store.param(i).shape, at::kBFloat16)).ok());
            }
          }
          ControllerOptions o;
          o.partition = *PlanFromParameterSizes(spec.model, 2, 2);
          o.microbatches = 2;
          o.adamw = ToAdamW(spec.optimizer);
          o.mode = mode;
          auto c = Controller::Create(o, &store, raw, &tl);
          ASSERT_TRUE(c.ok()) << c.status();
          ASSERT_TRUE((*c)->RunIteration(at::randint(spec.model.vocab, {2, 8}, at::kLong)).ok());
          ASSERT_TRUE((*c)->Flush().ok());
          int64_t moments = 0;
          const OptimizerSnapshot snap = (*c)->Snapshot();
          for (const auto* side : {&snap.adamw.m, &snap.adamw.v}) {
            for (const at::Tensor& t : *side) moments += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
          }
          EXPECT_GT(moments, 0);
          EXPECT_EQ(planning::HostStateBytes(spec.model, HostStateOptionsFor(spec, mapped)),
                    store.HostBytes() + moments);
          EXPECT_EQ(store.MappedBytes() > 0, mapped);
        }
      }
    }
  }
}

// The presets carry GPT-OSS's own fields; a model whose every block is sparse needs no dense
// MLP width, one with a dense block does; impossible shapes are refused naming the field.
TEST(ModelLayout, PresetsValidateAndImpossibleShapesAreRefusedByName) {
  const spec::ModelConfig gpt = *planning::ModelPreset("gpt-oss-20b");
  ASSERT_TRUE(gpt.Validate().ok()) << gpt.Validate();
  EXPECT_TRUE(gpt.gpt_oss() && gpt.attention_bias && gpt.rope_scaling.yarn);
  EXPECT_EQ(gpt.sliding_layers.size(), 12u);
  EXPECT_EQ(gpt.sliding_window, 128);
  EXPECT_DOUBLE_EQ(gpt.rope_scaling.attention_factor, 0.1 * std::log(32.0) + 1);
  EXPECT_DOUBLE_EQ(gpt.swiglu_limit, 7.0);

  spec::ModelConfig all_sparse = *planning::ModelPreset("qwen3-235b-a22b");
  ASSERT_EQ(all_sparse.intermediate, 0);
  EXPECT_TRUE(all_sparse.Validate().ok()) << all_sparse.Validate();
  all_sparse.mlp_only_layers = {0};  // now block 0 needs the dense width
  EXPECT_NE(all_sparse.Validate().message().find("intermediate (for dense blocks)"), std::string::npos)
      << all_sparse.Validate();

  auto refused = [](spec::ModelConfig m, const char* names) {
    const absl::Status st = m.Validate();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << names;
    EXPECT_NE(st.message().find(names), std::string::npos) << st;
  };
  spec::ModelConfig dense_gpt = *planning::ModelPreset("gpt-oss-tiny");
  dense_gpt.num_experts = 0;
  dense_gpt.experts_per_token = 0;
  dense_gpt.expert_intermediate = 0;
  dense_gpt.intermediate = 96;  // so the shape itself is fine
  refused(dense_gpt, "gpt_oss model has experts in every block");
  spec::ModelConfig m = *planning::ModelPreset("qwen3-tiny");
  m.num_kv_heads = 3;
  refused(m, "multiple of kv heads");
  m = *planning::ModelPreset("qwen3-tiny");
  m.family = "qwen3_moe";
  refused(m, "expected llama, qwen3 (with experts: Qwen3-MoE) or gpt_oss");
  m = *planning::ModelPreset("qwen3-tiny");
  m.lora.rank = 4;
  m.lora.targets = {"experts.down_proj"};
  refused(m, "needs a model with experts");
}

}  // namespace
}  // namespace rp::scheduler::runtime
