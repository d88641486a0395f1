#include "scheduler/runtime/base_source.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "workers/io/hf_config.h"
#include "workers/io/hf_tensors.h"

namespace rp::scheduler::runtime {

BaseSource::BaseSource(spec::ModelConfig model, at::ScalarType dtype, std::string hf_dir, uint64_t seed,
                       workers::io::FrozenBase record)
    : model_(std::move(model)), dtype_(dtype), hf_dir_(std::move(hf_dir)), seed_(seed), record_(std::move(record)) {}

absl::StatusOr<at::Tensor> BaseSource::Read(const std::string& name) {
  const workers::io::FrozenTensor* e = record_.Find(name);
  if (!e) return absl::NotFoundError(absl::StrCat("the base has no parameter ", name));
  at::Tensor master;
  if (!hf_dir_.empty()) {
    auto t = workers::io::ReadHfTensor(hf_dir_, e->name, e->shape);
    if (!t.ok()) return t.status();
    master = t->to(dtype_);  // as the store held it
  } else {
    if (!rebuilt_) {
      try {
        rebuilt_ = std::make_unique<workers::HostModelStore>(model_, dtype_, seed_);
      } catch (const std::exception& ex) {
        return absl::ResourceExhaustedError(absl::StrCat("rebuilding the seeded base: ", ex.what()));
      }
    }
    const int i = rebuilt_->FindParam(e->name);
    if (i < 0) return absl::NotFoundError(absl::StrCat("the base has no parameter ", e->name));
    master = rebuilt_->param(i).master;
  }
  if (workers::io::TensorCrc32(master) != e->crc32) {
    return absl::DataLossError(absl::StrCat("base tensor ", e->name, " is not the one the job trained on",
                                            hf_dir_.empty() ? std::string(" (the seeded base differs)")
                                                            : absl::StrCat(" ('", hf_dir_, "' changed since)")));
  }
  return master.to(at::kFloat);
}

}  // namespace rp::scheduler::runtime
