// data_parallel.h — a job's data-parallel group across nodes (paper §6, "Multi-node scaling"):
// every node runs the RoundPipe schedule on its share of the global batch, and the nodes sum
// their gradients before the optimizer steps, through Gloo in communicator processes
// (workers/collective/communicator.h). Two groups of processes per job: `control` carries the
// controller thread's scalars (the batch's labelled-token count, so every node divides by the
// global one; the loss for reports), `grads` the gradient sums from whichever thread steps the
// optimizer (the controller in sync mode, the optimizer worker in async mode) — two callers,
// each with its own group, so the collectives of each keep one order on every node.
//
// With shard_optimizer_state (the default, ZeRO-1) each trainable parameter has one owner node:
// the gradients are summed to the owners, each owner steps its parameters, and the updated
// weights are all-gathered. Without it every node sums every gradient (all-reduce) and
// steps the whole state.
//
// Contract: SumCounts / SumFloats from one thread, the gradient group's calls (SumTensors,
// ReduceToOwners, ...) from one thread (they may be different threads); traffic() from any. Any failure (a peer gone, a
// deadline) is returned with the rank and the operation named, and the group is unusable after it.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/collective/communicator.h"

namespace rp::workers {

class HostModelStore;
struct RunContext;

struct DataParallelOptions {
  int rank = 0;
  int size = 1;
  std::string group;                   // the job's group name (rendezvous keys)
  std::string hostname = "127.0.0.1";  // this node's address for Gloo
  std::string binary;                  // roundpipe-comm; empty: collective::DefaultCommBinary()
  std::chrono::milliseconds timeout{60000};
  int64_t buffer_bytes = int64_t{32} << 20;  // the gradient group's shared buffer (chunks of it)
  // ZeRO-1 over whole parameters: each trainable parameter has one owner node, the only one that
  // keeps its optimizer state and steps it; the owner then broadcasts the updated weights.
  bool shard_optimizer_state = true;
  const std::atomic<bool>* cancel = nullptr;  // connecting gives up once it turns true (the job cancelled)
  // A data-free (paced) store's tensors hold no values, yet their bytes cross the wire; at this
  // fraction of their size, so that a paced run at time scale s (workers/device/pacer.h) sets it
  // to s and keeps the real ratio of wire time to compute time on real links. 1 otherwise.
  double meta_wire_scale = 1;
  // The reduce-scatter of the gradients sends them as bf16 (rounded to nearest even) and sums
  // them in fp32 on arrival: half its bytes, at the cost of each node's contribution rounded to
  // bf16's 8 bits of mantissa. The weights' all-gather stays fp32 (every node must hold the same
  // weights). Off by default.
  bool bf16_gradients = false;
};

class DataParallelGroup {
 public:
  static absl::StatusOr<std::shared_ptr<DataParallelGroup>> Start(const DataParallelOptions& o,
                                                                  spec::RendezvousStore* store);
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Exact sums of non-negative integers below 2^48 (12-bit limbs through fp32), on the control
  // group (`on_grads`: the gradient group, for the thread that sums gradients).
  absl::StatusOr<std::vector<int64_t>> SumCounts(const std::vector<int64_t>& values, bool on_grads = false);
  // Sums of doubles, through fp32 (reports, not arithmetic that must be exact).
  absl::StatusOr<std::vector<double>> SumFloats(const std::vector<double>& values, bool on_grads = false);
  // Sums each tensor over the group in place (fp32 in the buffer; other float dtypes are
  // converted there and back), chunk by chunk through the shared buffer.
  absl::Status SumTensors(const std::vector<at::Tensor>& tensors);
  // Every node's tensors become `root`'s (through the buffer like SumTensors; gradient group).
  absl::Status BroadcastTensors(const std::vector<at::Tensor>& tensors, int root);

  // ZeRO-1's exchanges (sharded; paper §6): `tensors[j]` are parameter params[j]'s tensors (the
  // same count and shapes on every node). ReduceToOwners sums them over the nodes into the
  // owner's copy — a reduce-scatter whose blocks are each owner's parameters, so a node steps
  // only what it owns; the other nodes' copies are left as they were. GatherFromOwners gives
  // every node the owner's tensors (Gloo's all-gather of the owners' blocks). Each sends about
  // (size-1)/size of the tensors' fp32 bytes per node, where an all-reduce sends twice that.
  absl::Status ReduceToOwners(const std::vector<int>& params, const std::vector<std::vector<at::Tensor>>& tensors);
  absl::Status GatherFromOwners(const std::vector<int>& params, const std::vector<std::vector<at::Tensor>>& tensors);

  // What this node's gradient group has done so far: seconds inside collectives and the bytes it
  // put into them (each collective's data as this node sees it: fp32, or bf16 gradients). Any
  // thread.
  struct Traffic {
    double seconds = 0;
    int64_t bytes = 0;
  };
  Traffic traffic() const;

  // The optimizer-state shard (shard_optimizer_state): AssignOwners balances the parameters'
  // elements over the nodes (in parameter order, each to the node with the fewest so far: the
  // same answer on every node); Owns(i) says whether this node steps parameter i.
  bool sharded() const { return sharded_; }
  void AssignOwners(const std::vector<int64_t>& elements);
  int Owner(int param) const { return sharded_ ? owners_[static_cast<size_t>(param)] : rank_; }
  bool Owns(int param) const { return Owner(param) == rank_; }

 private:
  // Moves tensors through the gradient buffer: SumTensors (sum) and BroadcastTensors.
  absl::Status Through(const std::vector<at::Tensor>& tensors, collective::CollectiveOp op, int root);
  // The owners' blocks through the buffer: kReduceScatter or kAllGatherV.
  absl::Status ByOwner(const std::vector<int>& params, const std::vector<std::vector<at::Tensor>>& tensors,
                       collective::CollectiveOp op);
  // One collective on the gradient group, counted in traffic() as `bytes` put in.
  absl::Status RunGrads(const collective::OpRequest& op, int64_t bytes);

  int rank_ = 0;
  int size_ = 1;
  bool sharded_ = false;
  std::vector<int> owners_;  // per parameter (sharded)
  std::chrono::milliseconds timeout_{60000};
  double meta_wire_scale_ = 1;
  bool bf16_gradients_ = false;
  std::unique_ptr<collective::Communicator> control_;
  std::unique_ptr<collective::Communicator> grads_;
  std::atomic<int64_t> traffic_ns_{0};
  std::atomic<int64_t> traffic_bytes_{0};
};

// An iteration's loss and labelled tokens over every node (the loss is already divided by the
// tokens of all nodes: the sum is the global mean). On the gradient group, before the gradients,
// so that its order is the optimizer's on every node.
struct NodeSums {
  double loss = 0;
  int64_t tokens = 0;
};
absl::StatusOr<NodeSums> SumNodeStats(DataParallelGroup& g, const RunContext& ctx);

// The gradient buffers of the store's trainable parameters (what SumTensors sums in sync mode).
std::vector<at::Tensor> TrainableGrads(HostModelStore& store);
// Per parameter, the elements AssignOwners balances: a trainable parameter's, 0 for a frozen one.
std::vector<int64_t> OwnerElements(const HostModelStore& store);

// A synchronous iteration's exchange, after its last gradient is on the host: the nodes' loss and
// tokens (SumNodeStats), then the gradients — reduced to their owners when the state is sharded
// (ReduceGradsToOwners), summed everywhere otherwise — and the global gradient norm.
struct IterationSums {
  NodeSums nodes;
  double grad_norm = 0;
};
absl::StatusOr<IterationSums> SumIteration(DataParallelGroup& g, HostModelStore& store, const RunContext& ctx);

// The sharded step (sync mode): this node steps the trainable parameters it owns (master written),
// then every parameter's fp32 copy comes from its owner (ShareStepped) and the others' masters
// are rounded from it. The same steps, in the same order, as AdamW::StepAll on the summed
// gradients, on every node.
class AdamW;
struct AdamWState;
absl::Status StepShardedAndShare(AdamW& adamw, HostModelStore& store, DataParallelGroup& g, double lr,
                                 double grad_multiplier);
// The updated fp32 copies of the trainable parameters among `params` from their owners
// (GatherFromOwners; async P_cp takes the masters from them afterwards).
absl::Status ShareStepped(HostModelStore& store, DataParallelGroup& g, const std::vector<int>& params);
// The gradients (`grad_of(i)`) of the trainable parameters among `params`, summed into their
// owners (ReduceToOwners); `own_sq` (optional) gains the squares of the owned sums, this node's
// part of the global gradient norm (SumSquaresOverNodes). Every node calls it with the same list.
absl::Status ReduceGradsToOwners(DataParallelGroup& g, const HostModelStore& store, const std::vector<int>& params,
                                 const std::function<at::Tensor(int)>& grad_of, double* own_sq);
// Every node's `own_sq` summed (gradient group): the squared norm of the global gradient. A
// non-finite part anywhere (an fp16 overflow) makes the sum non-finite on every node.
absl::StatusOr<double> SumSquaresOverNodes(DataParallelGroup& g, double own_sq);
// A sharded optimizer state made whole for a checkpoint: every trainable parameter's moments
// come from its owner (a small descriptor, then the tensors, broadcast on the gradient group),
// so each node's checkpoint holds the whole state — the same bytes as one node's, which resumes
// on any number of nodes. `state` holds this node's own entries (the optimizer's views) and
// gains the others' (new tensors, held only while the checkpoint is written). Every node must
// call it at the same point (a checkpoint every node takes); the optimizer must be idle.
absl::Status GatherShardedState(DataParallelGroup& g, const HostModelStore& store, AdamWState* state);
// The entries of a whole state (a resumed checkpoint) this node does not own, dropped: it keeps
// about 1/size of the moments, as if it had stepped them itself.
void KeepOwnedState(const DataParallelGroup& g, AdamWState* state);

}  // namespace rp::workers
