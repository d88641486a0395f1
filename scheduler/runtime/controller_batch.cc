// Controller: a batch checked against the job (shapes, dtypes, token and label ranges, document
// positions) and split into micro-batches in the devices' host memory.
#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "scheduler/runtime/controller.h"
#include "workers/models/layers.h"

namespace rp::scheduler {

absl::Status Controller::ValidateBatch(const at::Tensor& tokens, const std::optional<at::Tensor>& labels,
                                       const std::optional<at::Tensor>& positions) const {
  return ValidateBatchFor(store_->config().vocab, opt_.microbatches, tokens, labels, positions);
}

absl::Status Controller::ValidateBatchFor(int64_t V, int microbatches, const at::Tensor& tokens,
                                          const std::optional<at::Tensor>& labels,
                                          const std::optional<at::Tensor>& positions) {
  if (!tokens.defined() || tokens.dim() != 2) {
    return absl::InvalidArgumentError("batch: tokens must be a 2-d [batch, sequence] tensor");
  }
  if (tokens.scalar_type() != at::kLong && tokens.scalar_type() != at::kInt) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: tokens must be int32 or int64, got ", c10::toString(tokens.scalar_type())));
  }
  const int64_t B = tokens.size(0), S = tokens.size(1);
  if (B == 0 || S == 0) return absl::InvalidArgumentError("batch: empty batch");
  if (B % microbatches != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: ", B, " sequences cannot be split into ", microbatches, " equal micro-batches"));
  }
  const int64_t lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
  if (lo < 0 || hi >= V) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: token ids must lie in [0, ", V, "), found [", lo, ", ", hi, "]"));
  }
  if (labels) {
    if (!labels->defined() || labels->sizes() != tokens.sizes()) {
      return absl::InvalidArgumentError("batch: labels must have the shape of tokens");
    }
    if (labels->scalar_type() != at::kLong && labels->scalar_type() != at::kInt) {
      return absl::InvalidArgumentError("batch: labels must be int32 or int64");
    }
    at::Tensor l = labels->to(at::kLong);
    at::Tensor bad = l.ne(workers::models::kIgnoreIndex).logical_and(l.lt(0).logical_or(l.ge(V)));
    if (bad.any().item<bool>()) {
      return absl::InvalidArgumentError(absl::StrCat("batch: labels must be -100 or lie in [0, ", V, ")"));
    }
  }
  if (positions) {
    if (!positions->defined() || positions->sizes() != tokens.sizes()) {
      return absl::InvalidArgumentError("batch: positions must have the shape of tokens");
    }
    if (positions->scalar_type() != at::kLong && positions->scalar_type() != at::kInt) {
      return absl::InvalidArgumentError("batch: positions must be int32 or int64");
    }
    // Each row starts a document; afterwards a position is 0 (a new document) or the previous + 1.
    at::Tensor p = positions->to(at::kLong);
    at::Tensor next = p.narrow(1, 1, S - 1), prev = p.narrow(1, 0, S - 1);
    const bool ok =
        p.select(1, 0).eq(0).all().item<bool>() && next.eq(0).logical_or(next.eq(prev + 1)).all().item<bool>();
    if (!ok) {
      return absl::InvalidArgumentError(
          "batch: positions must start every row at 0 and then be 0 (a new document) or the previous position + 1");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Controller::HostBatch> Controller::ToHostMicrobatches(const at::Tensor& tokens_in,
                                                                     const std::optional<at::Tensor>& labels_in,
                                                                     const std::optional<at::Tensor>& positions_in,
                                                                     bool training, bool validated) {
  if (!validated) {
    if (absl::Status st = ValidateBatch(tokens_in, labels_in, positions_in); !st.ok()) return st;
  }
  const int M = opt_.microbatches;
  at::Tensor tokens = tokens_in.to(at::kLong).contiguous();
  at::Tensor labels = labels_in ? labels_in->to(at::kLong).contiguous() : workers::models::ShiftLabels(tokens);
  HostBatch hb;
  hb.valid = labels.ne(workers::models::kIgnoreIndex).sum().item<int64_t>();
  if (hb.valid == 0 && training) return absl::InvalidArgumentError("batch: no token has a label to train on");
  std::vector<std::pair<const at::Tensor*, std::vector<at::Tensor>*>> parts = {{&tokens, &hb.tokens},
                                                                               {&labels, &hb.labels}};
  at::Tensor positions;
  if (positions_in) {
    positions = positions_in->to(at::kLong).contiguous();
    parts.push_back({&positions, &hb.positions});
  }
  // Micro-batch inputs go into the devices' host memory (pinned on CUDA: asynchronous uploads).
  const int64_t per = tokens.size(0) / M;
  try {
    for (int m = 0; m < M; ++m) {
      for (auto [src, dst] : parts) {
        const at::Tensor part = src->narrow(0, m * per, per);
        at::Tensor h = devices_.front()->EmptyHost(part.sizes(), part.scalar_type());
        h.copy_(part);
        dst->push_back(std::move(h));
      }
    }
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("batch: ", e.what()));
  }
  return hb;
}

}  // namespace rp::scheduler
