// router_aux.h — the router's auxiliary load-balancing loss of an iteration, per micro-batch, as
// transformers' load_balancing_loss_func computes it over all sparse blocks of one forward call:
//   aux = E · Σ_e (n_e / R) · (P_e / R),
// n_e the token-expert pairs routed to expert e and P_e the sum of the router's softmax for e,
// both summed over every sparse block's rows, R the rows of all sparse blocks together (tokens ×
// sparse blocks). The job's loss adds coef · aux / M per micro-batch (the mean over its M
// micro-batches); its gradient reaches each block's router through P_e only (n_e comes from a
// top-k: constant), so every block's backward needs the micro-batch's complete n.
//
// Blocks are tallied in pipeline order: forward stages tally theirs after their compute, the
// fused stage B_1 its own before its backward, and every backward stage runs after B_1 of the
// same micro-batch — so Loss and GradWeights always see the whole micro-batch.
//
// Contract: thread-safe (stages of several workers tally at once). Broken ordering (a query
// before every sparse block was tallied, a micro-batch out of range) throws std::logic_error,
// which the calling stage turns into the iteration's error.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "workers/base/mutex.h"

namespace rp::workers {

class RouterAuxTally {
 public:
  // `coef_per_microbatch`: the job's coefficient / M; `sparse_blocks`: how many blocks route.
  RouterAuxTally(int microbatches, int num_experts, int sparse_blocks, double coef_per_microbatch);

  // One sparse block's routing of micro-batch `mb` over `rows` tokens: counts [E] int64 on the
  // host, prob_sum [E] (any device, any graph: read as plain values).
  void Add(int mb, const at::Tensor& counts, const at::Tensor& prob_sum, int64_t rows);
  // The loss term coef / M · aux of micro-batch `mb`.
  double Loss(int mb) const;
  // d(coef / M · aux) / d(P_e of any one block) × multiplier: [E] fp32 on `device`.
  at::Tensor GradWeights(int mb, c10::Device device, double multiplier) const;

 private:
  struct Tally {
    std::vector<int64_t> counts;
    std::vector<double> prob_sums;
    int64_t rows = 0;
    int blocks = 0;
  };
  const Tally& Complete(int mb) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_experts_, sparse_blocks_;
  const double coef_;
  mutable base::Mutex mu_;
  std::vector<Tally> tallies_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rp::workers
