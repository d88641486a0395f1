// host_state.h — (planning) what a job's model state costs in host memory: the bytes the engine
// allocates for weights, gradients and optimizer state, from the model's shape and the job's
// optimizer and precision. Admission, the daemon's host-memory accounting and the simulator read
// it; tests hold it equal to what the store and the optimizer really allocate.
//
// Contract: pure functions of value types, any thread; never wraps (double arithmetic, saturated).
#pragma once

#include <cstdint>

#include "workers/spec/model_config.h"

namespace rp::planning {

// What a job's host state holds per parameter beyond the model's layout.
struct HostStateOptions {
  int master_bytes = 2;  // the master copy workers upload: 4 (fp32) or 2 (bf16, fp16)
  int moment_bytes = 8;  // optimizer state per trained parameter: AdamW 8 (4 with bf16 moments), SGD 4 or 0, Lion 4
  bool async_grad_copy = false;  // async optimizer: G_cp's own gradient copy, 4 B per trained parameter
  bool mapped_base = false;      // LoRA: the frozen base's masters alias the model files (allocated: none)
  // Adafactor: the optimizer state is factored (AdafactorStateElements fp32 values in all, not
  // moment_bytes per trained parameter).
  bool factored_moments = false;
  // A node of a data-parallel job whose optimizer state is sharded over `state_shards` nodes
  // (whole parameters each to the least loaded node): it holds at most 1/state_shards of the
  // trained elements' state plus one largest trained parameter's (StateShare). 1: all of it.
  int state_shards = 1;
};

// The fraction of the trained parameters' optimizer state a node of `o.state_shards` holds at
// most (1 when not sharded): the greedy owner assignment keeps every node within one largest
// trained parameter of an even split.
double StateShare(const spec::ModelConfig& m, const HostStateOptions& o);

// Elements of Adafactor's state over the trained parameters (torch.optim.Adafactor's layout):
// rows + columns per matrix (leading dimensions of stacked experts count as a batch), every
// element of a vector.
int64_t AdafactorStateElements(const spec::ModelConfig& m);

// Host bytes the engine allocates for a model's state (fp32 copy, master copy, gradient,
// moments, the async gradient copy; with LoRA the frozen base keeps only its master copy, or
// nothing when mapped, and the adapters the full state): what admission checks and what the
// store and optimizer hold once a step ran (tested against them). In double arithmetic,
// saturated near INT64_MAX: sizes come from clients and files and the estimate never wraps.
int64_t HostStateBytes(const spec::ModelConfig& m, const HostStateOptions& o);

// On a backend whose device memory is host memory (the CPU backend), what the workers' stage
// copies add to a job's host memory: every layer's weights uploaded (master dtype) and, where
// trained, its gradient in the same dtype — twice, since a forward and a backward slot of the
// same layers may be resident at once (each worker holds the running stage and the next one).
// Zero-copy backends (GPUs, the paced one) add nothing to host memory. Saturated like HostStateBytes.
int64_t CpuWorkingSetBytes(const spec::ModelConfig& m, const HostStateOptions& o);

}  // namespace rp::planning
