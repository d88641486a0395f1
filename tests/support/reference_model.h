// reference_model.h — the independent reference for engine tests: the same model trained the
// plain way in one process — whole batch, full-vocabulary logits, at::cross_entropy (mean over
// non-ignored tokens), autograd through the whole model, torch::nn::utils::clip_grad_norm_ and
// torch::optim::AdamW. Shares only the layer functions (embedding/block/norm) with the engine.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "workers/optim/adamw.h"
#include "workers/spec/model_config.h"
#include "workers/store/host_model_store.h"

namespace rp::testing {

class ReferenceModel {
 public:
  // Copies the initial fp32 weights of `init`.
  ReferenceModel(const workers::HostModelStore& init, const workers::AdamWOptions& opt);
  ~ReferenceModel();
  // One training step; returns the loss before the update.
  double Step(const at::Tensor& tokens, const std::optional<at::Tensor>& labels = std::nullopt);
  // One staleness-1 step: u_{k+1} = AdamW(u_k, g_k) with g_k = grad of L_k at u_{k-1}
  // (u_{-1} = u_0). Returns L_k(u_{k-1}).
  double StaleStep(const at::Tensor& tokens);
  // An asynchronous job's drain point (Controller::Flush): every step is in the weights, so the
  // next StaleStep's gradient is taken at the current weights.
  void Drain() { prev_.clear(); }
  // One step on documents run one by one, each on its own: [len] token ids and [len] labels
  // (-100 = no target; undefined = the next-token shift within the document). The loss is the
  // CE summed over every document's targets divided by their count: what a document-masked
  // packed batch must equal.
  struct Document {
    at::Tensor tokens, labels;
  };
  double StepDocuments(const std::vector<Document>& documents);
  // The mean CE of a batch at the current weights, no gradient, no step.
  double EvalLoss(const at::Tensor& tokens, const std::optional<at::Tensor>& labels = std::nullopt);
  const at::Tensor& param(const std::string& name) const { return params_.at(name); }
  const std::map<std::string, at::Tensor>& params() const { return params_; }

 private:
  spec::ModelConfig cfg_;
  std::vector<std::vector<std::string>> layer_names_;
  std::map<std::string, at::Tensor> params_;
  std::map<std::string, at::Tensor> prev_;  // u_{k-1} for StaleStep
  at::Tensor Loss(const std::map<std::string, at::Tensor>& w, const at::Tensor& tokens,
                  const std::optional<at::Tensor>& labels, bool sum = false);
  workers::AdamWOptions opt_;
  struct Optim;
  std::unique_ptr<Optim> optim_;
};

// ||a - b||_2 / ||b||_2 (computed in float64): the relative error of a whole tensor.
double RelativeError(const at::Tensor& a, const at::Tensor& b);

}  // namespace rp::testing
