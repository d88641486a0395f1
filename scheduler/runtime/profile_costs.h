// profile_costs.h — (runtime) the cost model the auto-partitioner plans with once a job's
// profiling iterations have measured every layer's times: memory from the job's real parameter
// sizes (master copy + device gradient) and the analytic activation estimate at the profiled
// micro-batch shape; the measured times are applied on top (planning::MeasuredProfile::Apply).
//
// Contract: a pure function of its arguments; the controller calls it on its own thread between
// iterations.
#pragma once

#include <cstdint>

#include "scheduler/planning/cost_model.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler::runtime {

// Per-layer memory of the job whose store is `store`, at micro-batches of `microbatch_rows` x
// `sequence_length` tokens (values below 1 count as 1) with the head's loss computed in chunks
// of `head_chunk_tokens`. Times are left at zero for the profile to fill.
planning::CostModel ProfileBaseCosts(const workers::HostModelStore& store, int64_t microbatch_rows,
                                     int64_t sequence_length, int64_t head_chunk_tokens);

}  // namespace rp::scheduler::runtime
