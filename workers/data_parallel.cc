// A job's data-parallel group (data_parallel.h).
#include "workers/data_parallel.h"

#include <ATen/ATen.h>

#include <array>

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

namespace {

// How an owner's moment is laid out, as the other nodes rebuild it: 0 absent, 1 the parameter's
// shape, 2 Adafactor's factored shape for that moment.
int ShapeKind(const at::Tensor& t, char which, const std::vector<int64_t>& shape) {
  if (!t.defined()) return 0;
  if (t.sizes().vec() == shape) return 1;
  const auto factored = AdafactorStateShape(which, shape);
  return factored && t.sizes().vec() == *factored ? 2 : -1;
}

}  // namespace

absl::Status GatherShardedState(DataParallelGroup& g, const HostModelStore& store, AdamWState* state) {
  const size_t n = static_cast<size_t>(store.num_params());
  state->m.resize(n);
  state->v.resize(n);
  for (int i = 0; i < store.num_params(); ++i) {
    const HostParam& p = store.param(i);
    if (!p.trainable) continue;
    const size_t k = static_cast<size_t>(i);
    std::array<at::Tensor*, 2> moments = {&state->m[k], &state->v[k]};
    const std::array<char, 2> which = {'m', 'v'};
    // The owner's descriptor: per moment its layout and whether it is bf16 (small integers, exact in fp32).
    at::Tensor desc = at::zeros({4}, at::kFloat);
    if (g.Owns(i)) {
      for (size_t j = 0; j < 2; ++j) {
        const int kind = ShapeKind(*moments[j], which[j], p.shape);
        if (kind < 0) return absl::InternalError(absl::StrCat("optimizer state of ", p.name, ": an unknown layout"));
        desc[static_cast<int64_t>(2 * j)] = kind;
        desc[static_cast<int64_t>(2 * j + 1)] = kind > 0 && moments[j]->scalar_type() == at::kBFloat16 ? 1 : 0;
      }
    }
    if (absl::Status st = g.BroadcastTensors({desc}, g.Owner(i)); !st.ok()) return st;
    std::vector<at::Tensor> data;
    for (size_t j = 0; j < 2; ++j) {
      const int kind = static_cast<int>(desc[static_cast<int64_t>(2 * j)].item<float>());
      if (kind == 0) continue;
      if (!g.Owns(i)) {
        const std::vector<int64_t> shape = kind == 1 ? p.shape : *AdafactorStateShape(which[j], p.shape);
        const bool bf16 = desc[static_cast<int64_t>(2 * j + 1)].item<float>() != 0;
        *moments[j] = at::empty(shape, at::TensorOptions().dtype(bf16 ? at::kBFloat16 : at::kFloat));
      }
      data.push_back(*moments[j]);
    }
    if (data.empty()) continue;
    if (absl::Status st = g.BroadcastTensors(data, g.Owner(i)); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void KeepOwnedState(const DataParallelGroup& g, AdamWState* state) {
  for (size_t i = 0; i < state->m.size(); ++i) {
    if (g.Owns(static_cast<int>(i))) continue;
    state->m[i] = at::Tensor();
    if (i < state->v.size()) state->v[i] = at::Tensor();
  }
}

}  // namespace rp::workers
