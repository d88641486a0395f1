// A job's data-parallel group (data_parallel.h).
#include "workers/data_parallel.h"

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "workers/optim/adamw.h"
#include "workers/run_context.h"
#include "workers/store/host_model_store.h"

namespace rp::workers {

namespace {

constexpr int64_t kLimb = 4096;  // 12 bits: a sum of up to 4096 limbs stays exact in fp32
constexpr int kLimbs = 4;        // 48 bits

// A tensor as it crosses the wire, flattened: a meta tensor (a data-free store) shrunk to
// `meta_scale` of its elements (DataParallelOptions::meta_wire_scale).
at::Tensor WireView(const at::Tensor& t, double meta_scale) {
  if (t.is_meta() && meta_scale < 1) {
    const auto n = static_cast<int64_t>(std::llround(static_cast<double>(t.numel()) * meta_scale));
    return at::empty({std::max<int64_t>(1, n)}, t.options());
  }
  return t.view({-1});
}

// One owner's tensors, flattened and laid end to end in parameter order, handed out in pieces.
class OwnerStream {
 public:
  absl::Status Add(const at::Tensor& t, double meta_scale) {
    if (!t.defined() || t.numel() == 0) return absl::OkStatus();
    if (!t.is_contiguous()) return absl::InvalidArgumentError("data parallel: a tensor is not contiguous");
    flat_.push_back(WireView(t, meta_scale));
    left_ += flat_.back().numel();
    return absl::OkStatus();
  }
  int64_t left() const { return left_; }
  // The next `n` elements (n <= left()), as views of the tensors they lie in.
  std::vector<at::Tensor> Take(int64_t n) {
    std::vector<at::Tensor> pieces;
    left_ -= n;
    while (n > 0) {
      const at::Tensor& t = flat_[next_];
      const int64_t len = std::min(n, t.numel() - at_);
      pieces.push_back(t.narrow(0, at_, len));
      n -= len;
      at_ += len;
      if (at_ == t.numel()) {
        ++next_;
        at_ = 0;
      }
    }
    return pieces;
  }

 private:
  std::vector<at::Tensor> flat_;
  size_t next_ = 0;
  int64_t at_ = 0;
  int64_t left_ = 0;
};

// Copies pieces into the fp32 buffer from `at` on (to_buffer) or back out of it. A data-free
// store's (meta) tensors copy nothing: their bytes still cross the wire (a paced benchmark).
void CopyPieces(float* buf, const std::vector<at::Tensor>& pieces, bool to_buffer) {
  int64_t at = 0;
  for (const at::Tensor& piece : pieces) {
    if (piece.is_meta()) {
      at += piece.numel();
      continue;
    }
    at::Tensor view = at::from_blob(buf + at, {piece.numel()}, at::TensorOptions().dtype(at::kFloat));
    if (to_buffer) {
      view.copy_(piece);
    } else {
      piece.copy_(view);
    }
    at += piece.numel();
  }
}

// Pieces into the buffer as bf16 (rounded to nearest even), from `at` on; meta pieces copy nothing.
void CopyPiecesBf16(uint16_t* buf, const std::vector<at::Tensor>& pieces) {
  int64_t at = 0;
  for (const at::Tensor& piece : pieces) {
    if (!piece.is_meta()) {
      at::from_blob(buf + at, {piece.numel()}, at::TensorOptions().dtype(at::kBFloat16)).copy_(piece);
    }
    at += piece.numel();
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<DataParallelGroup>> DataParallelGroup::Start(const DataParallelOptions& o,
                                                                            spec::RendezvousStore* store) {
  if (o.size < 2 || o.size > 4096) return absl::InvalidArgumentError("data parallel: 2 to 4096 nodes");
  auto g = std::make_shared<DataParallelGroup>();
  g->rank_ = o.rank;
  g->size_ = o.size;
  g->timeout_ = o.timeout;
  g->meta_wire_scale_ = o.meta_wire_scale;
  g->bf16_gradients_ = o.bf16_gradients;
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
  if (absl::Status st = comm.Run({collective::CollectiveOp::kAllReduce, 0, n, 0, 0, timeout_.count(), {}, false});
      !st.ok()) {
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
  if (absl::Status st = comm.Run({collective::CollectiveOp::kAllReduce, 0, n, 0, 0, timeout_.count(), {}, false});
      !st.ok()) {
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
    at::Tensor flat = WireView(t, meta_wire_scale_);
    for (int64_t at0 = 0; at0 < flat.numel(); at0 += cap) {
      const int64_t len = std::min(cap, flat.numel() - at0);
      at::Tensor piece = flat.narrow(0, at0, len);
      CopyPieces(buf, {piece}, /*to_buffer=*/true);
      if (absl::Status st = RunGrads({op, 0, len, 0, root, timeout_.count(), {}, false}, len * 4); !st.ok()) return st;
      CopyPieces(buf, {piece}, /*to_buffer=*/false);
    }
  }
  return absl::OkStatus();
}

absl::Status DataParallelGroup::RunGrads(const collective::OpRequest& op, int64_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = grads_->Run(op);
  traffic_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count(),
      std::memory_order_relaxed);
  traffic_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return st;
}

DataParallelGroup::Traffic DataParallelGroup::traffic() const {
  return {static_cast<double>(traffic_ns_.load(std::memory_order_relaxed)) * 1e-9,
          traffic_bytes_.load(std::memory_order_relaxed)};
}

absl::Status DataParallelGroup::ReduceToOwners(const std::vector<int>& params,
                                               const std::vector<std::vector<at::Tensor>>& tensors) {
  return ByOwner(params, tensors, collective::CollectiveOp::kReduceScatter);
}

absl::Status DataParallelGroup::GatherFromOwners(const std::vector<int>& params,
                                                 const std::vector<std::vector<at::Tensor>>& tensors) {
  return ByOwner(params, tensors, collective::CollectiveOp::kAllGatherV);
}

absl::Status DataParallelGroup::ByOwner(const std::vector<int>& params,
                                        const std::vector<std::vector<at::Tensor>>& tensors,
                                        collective::CollectiveOp op) {
  if (params.size() != tensors.size())
    return absl::InvalidArgumentError("data parallel: one tensor list per parameter");
  std::vector<OwnerStream> streams(static_cast<size_t>(size_));
  for (size_t j = 0; j < params.size(); ++j) {
    for (const at::Tensor& t : tensors[j]) {
      if (absl::Status st = streams[static_cast<size_t>(Owner(params[j]))].Add(t, meta_wire_scale_); !st.ok()) {
        return st;
      }
    }
  }
  const bool reduce = op == collective::CollectiveOp::kReduceScatter;
  // A round's blocks: the reduce-scatter's fill the buffer; the all-gather also needs room for
  // this node's own block after the gathered ones.
  const int64_t per = grads_->bytes() / 4 / (reduce ? size_ : size_ + 1);
  float* buf = grads_->data();
  const size_t me = static_cast<size_t>(rank_);
  for (;;) {
    std::vector<int64_t> counts(static_cast<size_t>(size_));
    std::vector<std::vector<at::Tensor>> pieces(static_cast<size_t>(size_));
    int64_t total = 0;
    for (size_t r = 0; r < streams.size(); ++r) {
      counts[r] = std::min(per, streams[r].left());
      pieces[r] = streams[r].Take(counts[r]);
      total += counts[r];
    }
    if (total == 0) return absl::OkStatus();
    if (reduce) {
      int64_t at = 0;
      for (size_t r = 0; r < streams.size(); ++r) {
        if (bf16_gradients_) {
          CopyPiecesBf16(reinterpret_cast<uint16_t*>(buf) + at, pieces[r]);
        } else {
          CopyPieces(buf + at, pieces[r], /*to_buffer=*/true);
        }
        at += counts[r];
      }
      // This node's block of the sum lands at the buffer's start (comm_main.cc: Gloo's
      // all-to-all of the blocks, summed on arrival).
      if (absl::Status st = RunGrads({op, 0, total, 0, 0, timeout_.count(), counts, bf16_gradients_},
                                     total * (bf16_gradients_ ? 2 : 4));
          !st.ok()) {
        return st;
      }
      CopyPieces(buf, pieces[me], /*to_buffer=*/false);
    } else {
      CopyPieces(buf + total, pieces[me], /*to_buffer=*/true);
      if (absl::Status st = RunGrads({op, total * 4, total, 0, 0, timeout_.count(), counts, false}, total * 4);
          !st.ok()) {
        return st;
      }
      int64_t at = 0;
      for (size_t r = 0; r < streams.size(); ++r) {
        if (r != me) CopyPieces(buf + at, pieces[r], /*to_buffer=*/false);
        at += counts[r];
      }
    }
  }
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

std::vector<int64_t> OwnerElements(const HostModelStore& store) {
  std::vector<int64_t> elements;
  for (int i = 0; i < store.num_params(); ++i) {
    const HostParam& p = store.param(i);
    elements.push_back(p.trainable ? p.master.numel() : 0);
  }
  return elements;
}

absl::StatusOr<IterationSums> SumIteration(DataParallelGroup& g, HostModelStore& store, const RunContext& ctx) {
  auto nodes = SumNodeStats(g, ctx);
  if (!nodes.ok()) return nodes.status();
  IterationSums out{*nodes, 0};
  if (!g.sharded()) {
    if (absl::Status st = g.SumTensors(TrainableGrads(store)); !st.ok()) return st;
    out.grad_norm = AdamW::GradNorm(store);
    return out;
  }
  std::vector<int> all(static_cast<size_t>(store.num_params()));
  for (int i = 0; i < store.num_params(); ++i) all[static_cast<size_t>(i)] = i;
  double own_sq = 0;
  if (absl::Status st = ReduceGradsToOwners(
          g, store, all, [&store](int i) { return store.param(i).grad; }, &own_sq);
      !st.ok()) {
    return st;
  }
  auto sq = SumSquaresOverNodes(g, own_sq);
  if (!sq.ok()) return sq.status();
  out.grad_norm = store.pacer() ? 0 : std::sqrt(*sq);
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
  if (absl::Status st = ShareStepped(store, g, trainable); !st.ok()) return st;
  // The masters of the others' parameters rounded here from the shared fp32 copies, as their
  // owners' steps rounded them (to nearest even), instead of crossing the wire too.
  for (int i : trainable) {
    HostParam& p = store.param(i);
    if (!g.Owns(i) && p.master.defined() && p.master.data_ptr() != p.fp32.data_ptr()) p.master.copy_(p.fp32);
  }
  return absl::OkStatus();
}

absl::Status ShareStepped(HostModelStore& store, DataParallelGroup& g, const std::vector<int>& params) {
  std::vector<int> trainable;
  std::vector<std::vector<at::Tensor>> tensors;
  for (int i : params) {
    HostParam& p = store.param(i);
    if (!p.trainable) continue;
    trainable.push_back(i);
    tensors.push_back({p.fp32});
  }
  return g.GatherFromOwners(trainable, tensors);
}

absl::Status ReduceGradsToOwners(DataParallelGroup& g, const HostModelStore& store, const std::vector<int>& params,
                                 const std::function<at::Tensor(int)>& grad_of, double* own_sq) {
  std::vector<int> trainable;
  std::vector<std::vector<at::Tensor>> tensors;
  for (int i : params) {
    if (!store.param(i).trainable) continue;
    trainable.push_back(i);
    tensors.push_back({grad_of(i)});
  }
  if (absl::Status st = g.ReduceToOwners(trainable, tensors); !st.ok()) return st;
  if (own_sq == nullptr || store.pacer()) return absl::OkStatus();
  for (size_t j = 0; j < trainable.size(); ++j) {
    if (g.Owns(trainable[j]) && tensors[j][0].defined())
      *own_sq += std::pow(at::norm(tensors[j][0], 2, at::kDouble).item<double>(), 2);
  }
  return absl::OkStatus();
}

absl::StatusOr<double> SumSquaresOverNodes(DataParallelGroup& g, double own_sq) {
  // Two fp32 parts (high and the rest) so the sum keeps about fp32's precision per term.
  const float hi = static_cast<float>(own_sq);
  const double lo = std::isfinite(own_sq) ? own_sq - static_cast<double>(hi) : 0.0;
  auto sums = g.SumFloats({hi, lo}, /*on_grads=*/true);
  if (!sums.ok()) return sums.status();
  return (*sums)[0] + (*sums)[1];
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
