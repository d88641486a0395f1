// engine_values.h — tests and benchmarks that compare the engine with plain LibTorch cross the
// facade's value types (scheduler/engine_types.h) with these conversions.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/engine.h"
#include "scheduler/engine_types.h"
#include "scheduler/runtime/model_adapter.h"
#include "workers/spec/model_config.h"

namespace rp::testing {

inline scheduler::Batch ToBatch(const at::Tensor& tokens, const std::optional<at::Tensor>& labels = std::nullopt) {
  scheduler::Batch b;
  const at::Tensor t = tokens.to(at::kInt).contiguous();
  b.rows = t.size(0);
  b.cols = t.size(1);
  b.tokens.assign(t.data_ptr<int32_t>(), t.data_ptr<int32_t>() + t.numel());
  if (labels) {
    const at::Tensor l = labels->to(at::kInt).contiguous();
    b.labels.assign(l.data_ptr<int32_t>(), l.data_ptr<int32_t>() + l.numel());
  }
  return b;
}

inline at::Tensor ToTensor(const scheduler::TensorValue& v) {
  at::Tensor t = at::empty(v.shape, at::kFloat);
  std::copy(v.data.begin(), v.data.end(), t.data_ptr<float>());
  return t;
}

// (name, shape) pairs, as the workers/io exporters take them.
inline std::vector<std::pair<std::string, std::vector<int64_t>>> NamedShapes(
    const std::vector<scheduler::ParameterShape>& shapes) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& p : shapes) out.emplace_back(p.name, p.shape);
  return out;
}

// A job's parameters as tensors, for the workers/io exporters and comparisons.
inline std::function<absl::StatusOr<at::Tensor>(const std::string&)> ParameterFetch(const scheduler::Engine& engine,
                                                                                    scheduler::JobId id) {
  return [&engine, id](const std::string& name) -> absl::StatusOr<at::Tensor> {
    auto v = engine.Parameter(id, name);
    if (!v.ok()) return v.status();
    return ToTensor(*v);
  };
}

inline at::Tensor ParameterTensor(const scheduler::Engine& engine, scheduler::JobId id, const std::string& name) {
  return ToTensor(*engine.Parameter(id, name));
}

}  // namespace rp::testing
