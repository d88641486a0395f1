// base_source.h — (runtime) the frozen parameters of a job whose host store is gone (it ended, or
// ran in an earlier daemon): its checkpoints describe the base (workers/io/frozen_base.h)
// instead of storing it, so a base parameter is read again from where the job got it — the
// model directory (model.hf_dir), or the seeded initialisation — rounded to the job's precision
// as the store held it, and checked against the checkpoint's record.
//
// Contract: one owner at a time (not thread-safe; EngineJob keeps it under run_mu). A seeded
// base is one random stream over the whole model, so the first read rebuilds the whole store and
// keeps it (seeded bases are small test models); a directory is read tensor by tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "workers/io/frozen_base.h"
#include "workers/spec/model_config.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler::runtime {

class BaseSource {
 public:
  // `record`: the base.json of the job's checkpoint; `hf_dir` empty for a seeded base.
  BaseSource(spec::ModelConfig model, at::ScalarType dtype, std::string hf_dir, uint64_t seed,
             workers::io::FrozenBase record);

  const workers::io::FrozenBase& record() const { return record_; }
  bool Has(const std::string& name) const { return record_.Find(name) != nullptr; }
  // The fp32 value of frozen parameter `name`. NotFound when the record has no such tensor;
  // DataLoss naming it when its source no longer holds the values the job trained on.
  absl::StatusOr<at::Tensor> Read(const std::string& name);

 private:
  spec::ModelConfig model_;
  at::ScalarType dtype_;
  std::string hf_dir_;
  uint64_t seed_;
  workers::io::FrozenBase record_;
  std::unique_ptr<workers::HostModelStore> rebuilt_;  // seeded bases, on the first read
};

}  // namespace rp::scheduler::runtime
