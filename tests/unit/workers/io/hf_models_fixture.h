// hf_models_fixture.h — what the model-I/O tests share: the HfModels fixture (tiny models and
// their references made once per binary by make_hf_models.py with PyPI's transformers), and two
// training iterations through the engine compared against such a reference.
#pragma once

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "scheduler/engine.h"
#include "workers/io/safetensors_reader.h"
#include "workers/spec/model_config.h"

namespace rp::workers::io {

class HfModels : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;
  static std::string dir_, error_;
};

// Two iterations of one job on `devices` with `partition` and the optimizer `mode` over the
// reference's tokens: the per-iteration stats, and the engine (for parameters and export).
struct MoeRun {
  std::unique_ptr<scheduler::Engine> engine;
  scheduler::JobId id = 0;
  std::vector<scheduler::IterationStats> stats;
};
MoeRun RunTwoSteps(const spec::ModelConfig& cfg, const std::string& model_dir, const std::string& devices,
                   const planning::Partition& partition, planning::OptimizerMode mode, const at::Tensor& tokens);
// The same with any optimizer and number of iterations (each on `tokens`).
MoeRun RunSteps(const spec::ModelConfig& cfg, const std::string& model_dir, const std::string& devices,
                const planning::Partition& partition, planning::OptimizerMode mode, const at::Tensor& tokens,
                const spec::OptimizerSpec& optimizer, int steps, int microbatches = 4);

// Losses and gradient norms of both steps, and every weight after them, against a reference
// made by transformers; `expert_tensors` of the parameters are expert tensors (mlp.experts.*).
void ExpectTrainedLikeReference(const MoeRun& run, SafetensorsFile& ref, const planning::Partition& partition,
                                bool async, int expert_tensors);

// Exports the run's weights in the hub's layout to `out` (fp32, shards of 40 KiB), has
// transformers load the export and compare it with the engine's weights bit for bit, and reads
// it back with our own loader: `check_param` must come back equal.
void ExpectExportLoadsInTransformers(const MoeRun& run, const spec::ModelConfig& cfg, const std::string& out,
                                     const std::string& check_param);

}  // namespace rp::workers::io
