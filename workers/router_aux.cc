#include "workers/router_aux.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace rp::workers {

RouterAuxTally::RouterAuxTally(int microbatches, int num_experts, int sparse_blocks, double coef_per_microbatch)
    : num_experts_(num_experts), sparse_blocks_(sparse_blocks), coef_(coef_per_microbatch) {
  tallies_.resize(static_cast<size_t>(microbatches));
  for (Tally& t : tallies_) {
    t.counts.assign(static_cast<size_t>(num_experts), 0);
    t.prob_sums.assign(static_cast<size_t>(num_experts), 0.0);
  }
}

void RouterAuxTally::Add(int mb, const at::Tensor& counts, const at::Tensor& prob_sum, int64_t rows) {
  const at::Tensor n = counts.to(at::kCPU, at::kLong).contiguous();
  const at::Tensor p = prob_sum.detach().to(at::kCPU, at::kDouble).contiguous();
  if (n.numel() != num_experts_ || p.numel() != num_experts_) {
    throw std::logic_error(
        absl::StrCat("router tally of ", n.numel(), "/", p.numel(), " experts, expected ", num_experts_));
  }
  base::MutexLock lock(&mu_);
  if (mb < 0 || mb >= static_cast<int>(tallies_.size())) {
    throw std::logic_error(absl::StrCat("router tally for micro-batch ", mb, " of ", tallies_.size()));
  }
  Tally& t = tallies_[static_cast<size_t>(mb)];
  for (int e = 0; e < num_experts_; ++e) {
    t.counts[static_cast<size_t>(e)] += n.data_ptr<int64_t>()[e];
    t.prob_sums[static_cast<size_t>(e)] += p.data_ptr<double>()[e];
  }
  t.rows += rows;
  ++t.blocks;
}

const RouterAuxTally::Tally& RouterAuxTally::Complete(int mb) const {
  if (mb < 0 || mb >= static_cast<int>(tallies_.size())) {
    throw std::logic_error(absl::StrCat("router tally for micro-batch ", mb, " of ", tallies_.size()));
  }
  const Tally& t = tallies_[static_cast<size_t>(mb)];
  if (t.blocks != sparse_blocks_ || t.rows <= 0) {
    throw std::logic_error(absl::StrCat("router tally of micro-batch ", mb, " read with ", t.blocks, " of ",
                                        sparse_blocks_, " sparse blocks in"));
  }
  return t;
}

double RouterAuxTally::Loss(int mb) const {
  base::MutexLock lock(&mu_);
  const Tally& t = Complete(mb);
  const double r = static_cast<double>(t.rows);
  double sum = 0;
  for (int e = 0; e < num_experts_; ++e) {
    sum += static_cast<double>(t.counts[static_cast<size_t>(e)]) / r * (t.prob_sums[static_cast<size_t>(e)] / r);
  }
  return coef_ * num_experts_ * sum;
}

at::Tensor RouterAuxTally::GradWeights(int mb, c10::Device device, double multiplier) const {
  base::MutexLock lock(&mu_);
  const Tally& t = Complete(mb);
  const double r = static_cast<double>(t.rows);
  at::Tensor w = at::empty({num_experts_}, at::kFloat);
  for (int e = 0; e < num_experts_; ++e) {
    w.data_ptr<float>()[e] = static_cast<float>(multiplier * coef_ * num_experts_ *
                                                static_cast<double>(t.counts[static_cast<size_t>(e)]) / (r * r));
  }
  return w.to(device);
}

}  // namespace rp::workers
