// tiny_spec.h — the small job spec the daemon tests, the spec fuzzer and the benchmarks share
// (a 2-block byte-level Llama, fp32, sync optimizer, batch 4 x 16).
#pragma once

#include "roundpipe/v1/jobs.pb.h"

namespace rp::testing {

inline roundpipe::v1::JobSpec TinyJobSpec() {
  roundpipe::v1::JobSpec s;
  s.set_name("tiny");
  auto* m = s.mutable_model();
  m->set_family("llama");
  m->set_vocab(256);
  m->set_hidden(32);
  m->set_intermediate(64);
  m->set_num_blocks(2);
  m->set_num_heads(2);
  m->set_num_kv_heads(1);
  m->set_head_dim(16);
  m->set_init_seed(7);
  s.set_precision(roundpipe::v1::PRECISION_FP32);
  s.mutable_optimizer()->set_lr(1e-3);
  s.mutable_optimizer()->set_mode(roundpipe::v1::OPTIMIZER_MODE_SYNC);
  s.mutable_batching()->set_global_batch(4);
  s.mutable_batching()->set_micro_batch(1);
  s.mutable_batching()->set_sequence_length(16);
  return s;
}

}  // namespace rp::testing
