#include "scheduler/runtime/export.h"

#include "workers/io/hf_export.h"

namespace rp::scheduler::runtime {

absl::StatusOr<int64_t> WriteExport(const std::string& dir, const spec::ModelConfig& config,
                                    const std::vector<ParameterShape>& shapes, const TensorFetch& fetch,
                                    at::ScalarType dtype, ExportKind kind, const StopCheck& stop) {
  const TensorFetch checked = [&](const std::string& name) -> absl::StatusOr<at::Tensor> {
    if (stop) {
      if (absl::Status st = stop(); !st.ok()) return st;
    }
    return fetch(name);
  };
  std::vector<workers::io::NamedShape> named;
  for (const ParameterShape& p : shapes) named.emplace_back(p.name, p.shape);
  workers::io::HfExportOptions o;
  o.dtype = dtype;
  if (kind != ExportKind::kHfModel && config.lora.rank <= 0) {
    return absl::InvalidArgumentError("merge_lora: this job has no LoRA adapters");
  }
  if (config.lora.rank > 0 && kind == ExportKind::kHfModel) kind = ExportKind::kPeftAdapter;
  switch (kind) {
    case ExportKind::kPeftAdapter:
      return workers::io::ExportPeftAdapter(dir, config, named, checked);
    case ExportKind::kMergedLora:
      return workers::io::ExportMergedLora(dir, config, named, checked, o);
    case ExportKind::kHfModel:
      break;
  }
  return workers::io::ExportHfModel(dir, config, named, checked, o);
}

}  // namespace rp::scheduler::runtime
