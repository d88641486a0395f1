#include "tests/support/reference_model.h"

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include "workers/models/layers.h"

namespace rp::testing {

struct ReferenceModel::Optim {
  std::vector<at::Tensor> list;
  std::unique_ptr<torch::optim::AdamW> adamw;
};

ReferenceModel::ReferenceModel(const workers::HostModelStore& init, const workers::AdamWOptions& opt)
    : cfg_(init.config()), opt_(opt), optim_(std::make_unique<Optim>()) {
  for (int l = 0; l < cfg_.num_layers(); ++l) {
    std::vector<std::string> names;
    for (int id : init.layer_params(l)) {
      const workers::HostParam& p = init.param(id);
      names.push_back(p.name);
      if (!params_.count(p.name)) {
        params_[p.name] = p.fp32.clone().set_requires_grad(true);
        optim_->list.push_back(params_[p.name]);
      }
    }
    layer_names_.push_back(names);
  }
  optim_->adamw = std::make_unique<torch::optim::AdamW>(
      optim_->list,
      torch::optim::AdamWOptions(opt.lr).betas({opt.beta1, opt.beta2}).eps(opt.eps).weight_decay(opt.weight_decay));
}

ReferenceModel::~ReferenceModel() = default;

at::Tensor ReferenceModel::Loss(const std::map<std::string, at::Tensor>& params, const at::Tensor& tokens_in,
                                const std::optional<at::Tensor>& labels_in, bool sum) {
  at::Tensor tokens = tokens_in.to(at::kLong);
  at::Tensor labels = labels_in ? labels_in->to(at::kLong) : workers::models::ShiftLabels(tokens);
  auto w = [&](int layer) {
    std::vector<at::Tensor> out;
    for (const auto& n : layer_names_[static_cast<size_t>(layer)]) out.push_back(params.at(n));
    return out;
  };
  workers::models::Rope rope = workers::models::MakeRope(cfg_, tokens.size(1), c10::Device(c10::kCPU));
  at::Tensor x = workers::models::EmbeddingForward(w(0)[0], tokens);
  for (int l = 1; l <= cfg_.num_blocks; ++l) x = workers::models::BlockForward(cfg_, l - 1, w(l), x, rope);
  std::vector<at::Tensor> head = w(cfg_.head_layer());
  at::Tensor hn = workers::models::FinalNorm(cfg_, head[0], x);
  at::Tensor logits = at::matmul(hn.to(at::kFloat), head[1].to(at::kFloat).t());
  return at::cross_entropy_loss(logits.reshape({-1, cfg_.vocab}), labels.reshape({-1}), {},
                                sum ? at::Reduction::Sum : at::Reduction::Mean, workers::models::kIgnoreIndex);
}

double ReferenceModel::Step(const at::Tensor& tokens, const std::optional<at::Tensor>& labels) {
  optim_->adamw->zero_grad();
  at::Tensor loss = Loss(params_, tokens, labels);
  loss.backward();
  if (opt_.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(optim_->list, opt_.max_grad_norm);
  optim_->adamw->step();
  return loss.item<double>();
}

double ReferenceModel::StepDocuments(const std::vector<Document>& documents) {
  optim_->adamw->zero_grad();
  at::Tensor total = at::zeros({}, at::kFloat);
  int64_t targets = 0;
  for (const Document& d : documents) {
    const at::Tensor t = d.tokens.reshape({1, -1});
    const at::Tensor l = d.labels.defined() ? d.labels.reshape({1, -1}).to(at::kLong) : workers::models::ShiftLabels(t);
    const int64_t n = l.ne(workers::models::kIgnoreIndex).sum().item<int64_t>();
    if (n == 0) continue;  // nothing to learn from (and a sum over nothing has no graph to add)
    total = total + Loss(params_, t, l, /*sum=*/true);
    targets += n;
  }
  at::Tensor loss = total / static_cast<double>(targets);
  loss.backward();
  if (opt_.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(optim_->list, opt_.max_grad_norm);
  optim_->adamw->step();
  return loss.item<double>();
}

double ReferenceModel::EvalLoss(const at::Tensor& tokens, const std::optional<at::Tensor>& labels) {
  at::NoGradGuard no_grad;
  return Loss(params_, tokens, labels).item<double>();
}

double ReferenceModel::StaleStep(const at::Tensor& tokens) {
  if (prev_.empty()) {
    for (const auto& [n, t] : params_) prev_[n] = t.detach().clone();
  }
  std::map<std::string, at::Tensor> eval;
  for (const auto& [n, t] : prev_) eval[n] = t.clone().set_requires_grad(true);
  at::Tensor loss = Loss(eval, tokens, std::nullopt);
  loss.backward();
  optim_->adamw->zero_grad();
  std::map<std::string, at::Tensor> before;
  for (auto& [n, t] : params_) {
    t.mutable_grad() = eval[n].grad().clone();
    before[n] = t.detach().clone();
  }
  if (opt_.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(optim_->list, opt_.max_grad_norm);
  optim_->adamw->step();
  prev_ = std::move(before);
  return loss.item<double>();
}

double RelativeError(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor af = a.detach().to(at::kDouble), bf = b.detach().to(at::kDouble);
  const double scale = bf.norm().item<double>();
  const double diff = (af - bf).norm().item<double>();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace rp::testing
