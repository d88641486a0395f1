// A job's data-parallel group (data_parallel.h).
#include "workers/data_parallel.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "workers/optim/adamw.h"
#include "workers/run_context.h"
#include "workers/store/host_model_store.h"

namespace rp::workers {

namespace {

constexpr int64_t kLimb = 4096;  // 12 bits: a sum of up to 4096 limbs stays exact in fp32
constexpr int kLimbs = 4;        // 48 bits

}  // namespace

absl::StatusOr<std::shared_ptr<DataParallelGroup>> DataParallelGroup::Start(const DataParallelOptions& o,
                                                                            spec::RendezvousStore* store) {
  if (o.size < 2 || o.size > 4096) return absl::InvalidArgumentError("data parallel: 2 to 4096 nodes");
  auto g = std::make_shared<DataParallelGroup>();
  g->rank_ = o.rank;
  g->size_ = o.size;
  g->timeout_ = o.timeout;
  collective::CommunicatorOptions c;
  c.binary = o.binary;
  c.rank = o.rank;
  c.size = o.size;
  c.hostname = o.hostname;
  c.connect_timeout = o.timeout;
  c.cancel = o.cancel;
  c.buffer_bytes = 4096 * 4;
  c.group = o.group + "/control";
  auto control = collective::Communicator::Start(c, store);
  if (!control.ok()) return control.status();
  g->control_ = std::move(*control);
  c.buffer_bytes = std::max<int64_t>(4096, o.buffer_bytes / 4 * 4);
  c.group = o.group + "/grads";
  auto grads = collective::Communicator::Start(c, store);
  if (!grads.ok()) return grads.status();
  g->grads_ = std::move(*grads);
  return g;
}

absl::StatusOr<std::vector<int64_t>> DataParallelGroup::SumCounts(const std::vector<int64_t>& values, bool on_grads) {
  collective::Communicator& comm = on_grads ? *grads_ : *control_;
  const int64_t n = static_cast<int64_t>(values.size()) * kLimbs;
  if (n * 4 > comm.bytes()) return absl::InvalidArgumentError("data parallel: too many counts at once");
  float* buf = comm.data();
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0 || values[i] >= (int64_t{1} << 48)) {
      return absl::InvalidArgumentError("data parallel: a count outside [0, 2^48)");
    }
    int64_t v = values[i];
    for (int l = 0; l < kLimbs; ++l, v /= kLimb)
      buf[i * kLimbs + static_cast<size_t>(l)] = static_cast<float>(v % kLimb);
  }
  if (absl::Status st = comm.Run({collective::CollectiveOp::kAllReduce, 0, n, 0, 0, timeout_.count(), {}}); !st.ok()) {
    return st;
  }
  std::vector<int64_t> out(values.size(), 0);
  for (size_t i = 0; i < values.size(); ++i) {
    int64_t scale = 1;
    for (int l = 0; l < kLimbs; ++l, scale *= kLimb) {
      out[i] += static_cast<int64_t>(buf[i * kLimbs + static_cast<size_t>(l)]) * scale;
    }
  }
  return out;
}

absl::StatusOr<std::vector<double>> DataParallelGroup::SumFloats(const std::vector<double>& values, bool on_grads) {
  collective::Communicator& comm = on_grads ? *grads_ : *control_;
  const int64_t n = static_cast<int64_t>(values.size());
  if (n * 4 > comm.bytes()) return absl::InvalidArgumentError("data parallel: too many values at once");
  float* buf = comm.data();
  for (size_t i = 0; i < values.size(); ++i) buf[i] = static_cast<float>(values[i]);
  if (absl::Status st = comm.Run({collective::CollectiveOp::kAllReduce, 0, n, 0, 0, timeout_.count(), {}}); !st.ok()) {
    return st;
  }
  return std::vector<double>(buf, buf + n);
}

absl::Status DataParallelGroup::SumTensors(const std::vector<at::Tensor>& tensors) {
  return Through(tensors, collective::CollectiveOp::kAllReduce, 0);
}

absl::Status DataParallelGroup::BroadcastTensors(const std::vector<at::Tensor>& tensors, int root) {
  return Through(tensors, collective::CollectiveOp::kBroadcast, root);
}

absl::Status DataParallelGroup::Through(const std::vector<at::Tensor>& tensors, collective::CollectiveOp op, int root) {
  const int64_t cap = grads_->bytes() / 4;
  float* buf = grads_->data();
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (!t.is_contiguous()) return absl::InvalidArgumentError("data parallel: a tensor is not contiguous");
    at::Tensor flat = t.view({-1});
    for (int64_t at0 = 0; at0 < flat.numel(); at0 += cap) {
      const int64_t len = std::min(cap, flat.numel() - at0);
      at::Tensor piece = flat.narrow(0, at0, len);
      at::Tensor view = at::from_blob(buf, {len}, at::TensorOptions().dtype(at::kFloat));
      view.copy_(piece);
      if (absl::Status st = grads_->Run({op, 0, len, 0, root, timeout_.count(), {}}); !st.ok()) return st;
      piece.copy_(view);
    }
  }
  return absl::OkStatus();
}

void DataParallelGroup::AssignOwners(const std::vector<int64_t>& elements) {
  sharded_ = true;
  owners_.assign(elements.size(), 0);
  std::vector<int64_t> load(static_cast<size_t>(size_), 0);
  for (size_t i = 0; i < elements.size(); ++i) {
    if (elements[i] == 0) continue;  // frozen: nobody steps it
    int best = 0;
    for (int k = 1; k < size_; ++k) best = load[static_cast<size_t>(k)] < load[static_cast<size_t>(best)] ? k : best;
    owners_[i] = best;
    load[static_cast<size_t>(best)] += elements[i];
  }
}

absl::StatusOr<NodeSums> SumNodeStats(DataParallelGroup& g, const RunContext& ctx) {
  auto loss = g.SumFloats({ctx.loss()}, /*on_grads=*/true);
  if (!loss.ok()) return loss.status();
  auto tokens = g.SumCounts({ctx.tokens()}, /*on_grads=*/true);
  if (!tokens.ok()) return tokens.status();
  return NodeSums{(*loss)[0], (*tokens)[0]};
}

std::vector<at::Tensor> TrainableGrads(HostModelStore& store) {
  std::vector<at::Tensor> out;
  for (int i = 0; i < store.num_params(); ++i) {
    HostParam& p = store.param(i);
    if (p.trainable && p.grad.defined()) out.push_back(p.grad);
  }
  return out;
}

absl::Status StepShardedAndShare(AdamW& adamw, HostModelStore& store, DataParallelGroup& g, double lr,
                                 double grad_multiplier) {
  adamw.BeginStep();
  std::vector<int> trainable;
  for (int i = 0; i < store.num_params(); ++i) {
    HostParam& p = store.param(i);
    if (!p.trainable) continue;
    trainable.push_back(i);
    if (g.Owns(i)) adamw.StepParam(store, i, p.grad, lr, grad_multiplier, /*write_master=*/true);
  }
  return ShareStepped(store, g, trainable, /*with_master=*/true);
}

absl::Status ShareStepped(HostModelStore& store, DataParallelGroup& g, const std::vector<int>& params,
                          bool with_master) {
  for (int i : params) {
    HostParam& p = store.param(i);
    if (!p.trainable) continue;
    std::vector<at::Tensor> mine = {p.fp32};
    if (with_master && p.master.data_ptr() != p.fp32.data_ptr()) mine.push_back(p.master);
    if (absl::Status st = g.BroadcastTensors(mine, g.Owner(i)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace rp::workers
