// The chunked LM head: cross-entropy and its gradient over chunks of tokens, never holding a
// whole [tokens, vocab] logit matrix (ChunkedHeadLoss, ChunkedHeadLossAndGrad in layers.h).
#include "workers/models/layers.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace rp::workers::models {

namespace {

// One chunk of the head: tokens [start, start+n) of `hn` against the head weight `wf`. On a GPU
// with a bf16/fp16 model the head GEMMs run in the model's dtype on tensor cores (fp32
// accumulation inside cuBLAS), with logits, softmax and the loss in fp32 — the head of a
// 150k-vocabulary model is the largest GEMM of the network. On the CPU backend (and for fp32
// models) everything stays fp32, as the tests' references do.
struct HeadChunk {
  at::Tensor hidden;  // [n, h] in the GEMM dtype
  at::Tensor logits;  // [n, V] fp32, the only full-width tensor
  at::Tensor lse;     // [n]
  at::Tensor safe;    // labels with ignored ones replaced by 0
  at::Tensor valid;   // fp32 0/1
};
bool LowPrecisionHead(const at::Tensor& hn, const at::Tensor& weight) {
  return hn.is_cuda() && weight.scalar_type() != at::kFloat;
}
HeadChunk Chunk(const at::Tensor& hn, const at::Tensor& wf, const at::Tensor& labels, int64_t start, int64_t n,
                bool low_precision) {
  HeadChunk c;
  c.hidden = hn.narrow(0, start, n).to(low_precision ? wf.scalar_type() : at::kFloat);
  const at::Tensor lc = labels.narrow(0, start, n);
  const at::Tensor valid = lc.ne(kIgnoreIndex);
  c.safe = at::where(valid, lc, at::zeros_like(lc));
  c.valid = valid.to(at::kFloat);
  c.logits = at::matmul(c.hidden, wf.t()).to(at::kFloat);
  c.lse = at::logsumexp(c.logits, 1);
  return c;
}
at::Tensor ChunkLoss(const HeadChunk& c) {  // sum of CE over the valid rows
  return ((c.lse - c.logits.gather(1, c.safe.unsqueeze(1)).squeeze(1)) * c.valid).sum();
}

}  // namespace

HeadLossGrad ChunkedHeadLossAndGrad(const at::Tensor& hn, const at::Tensor& weight, const at::Tensor& labels,
                                    double scale, int64_t chunk, bool weight_grad) {
  HeadLossGrad r;
  const int64_t T = hn.size(0);
  r.grad_hidden = at::zeros_like(hn);
  if (weight_grad) r.grad_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
  const bool low_precision = LowPrecisionHead(hn, weight);
  const at::Tensor wf = low_precision ? weight : weight.to(at::kFloat);
  for (int64_t start = 0; start < T; start += chunk) {
    const int64_t n = std::min(chunk, T - start);
    const HeadChunk c = Chunk(hn, wf, labels, start, n, low_precision);
    r.loss_sum += ChunkLoss(c).item<double>();
    r.tokens += static_cast<int64_t>(c.valid.sum().item<double>());
    // d(sum CE)/d logits = softmax - onehot, zero for ignored rows; times `scale`.
    at::Tensor g = at::exp(c.logits - c.lse.unsqueeze(1));
    g.scatter_add_(1, c.safe.unsqueeze(1), -at::ones({n, 1}, g.options()));
    g.mul_((c.valid * scale).unsqueeze(1));
    if (low_precision) g = g.to(weight.scalar_type());
    r.grad_hidden.narrow(0, start, n).copy_(at::matmul(g, wf));
    if (weight_grad) r.grad_weight.add_(at::matmul(g.t(), c.hidden));
  }
  return r;
}

HeadLoss ChunkedHeadLoss(const at::Tensor& hn, const at::Tensor& weight, const at::Tensor& labels, int64_t chunk) {
  HeadLoss r;
  const int64_t T = hn.size(0);
  const bool low_precision = LowPrecisionHead(hn, weight);
  const at::Tensor wf = low_precision ? weight : weight.to(at::kFloat);
  at::Tensor sum = at::zeros({}, hn.options().dtype(at::kDouble));
  at::Tensor count = at::zeros({}, hn.options().dtype(at::kDouble));
  for (int64_t start = 0; start < T; start += chunk) {
    const HeadChunk c = Chunk(hn, wf, labels, start, std::min(chunk, T - start), low_precision);
    sum.add_(ChunkLoss(c).to(at::kDouble));
    count.add_(c.valid.sum().to(at::kDouble));
  }
  // One host synchronisation per call, not one per chunk.
  r.loss_sum = sum.item<double>();
  r.tokens = static_cast<int64_t>(count.item<double>());
  return r;
}

at::Tensor ShiftLabels(const at::Tensor& tokens) {
  at::Tensor labels = at::full_like(tokens, kIgnoreIndex);
  const int64_t s = tokens.size(1);
  if (s > 1) labels.narrow(1, 0, s - 1).copy_(tokens.narrow(1, 1, s - 1));
  return labels;
}

}  // namespace rp::workers::models
