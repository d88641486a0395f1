#include "server/metrics.h"

namespace rp::server {

namespace {
using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}
}  // namespace

DaemonMetrics::DaemonMetrics(prometheus::Registry& r)
    : tokens_trained(BuildCounter()
                         .Name("roundpipe_tokens_trained_total")
                         .Help("Tokens with a training target processed by finished iterations")
                         .Register(r)
                         .Add({})),
      iterations(
          BuildCounter().Name("roundpipe_iterations_total").Help("Finished training iterations").Register(r).Add({})),
      iteration_duration(BuildHistogram()
                             .Name("roundpipe_iteration_duration_seconds")
                             .Help("Wall time of one iteration (forward, backward and optimizer step)")
                             .Register(r)
                             .Add({}, SecondsBuckets())),
      optimizer_step(BuildHistogram()
                         .Name("roundpipe_optimizer_step_seconds")
                         .Help("Wall time of one optimizer step on the CPU optimizer worker")
                         .Register(r)
                         .Add({}, SecondsBuckets())),
      loss(BuildGauge()
               .Name("roundpipe_loss")
               .Help("Loss of the latest iteration of the running job")
               .Register(r)
               .Add({})),
      eval_loss(BuildGauge()
                    .Name("roundpipe_eval_loss")
                    .Help("Validation loss of the latest evaluation (mean CE over the validation set)")
                    .Register(r)
                    .Add({})),
      evaluations(BuildCounter()
                      .Name("roundpipe_evaluations_total")
                      .Help("Finished evaluations on validation data")
                      .Register(r)
                      .Add({})),
      learning_rate(BuildGauge()
                        .Name("roundpipe_learning_rate")
                        .Help("Learning rate of the latest optimizer step")
                        .Register(r)
                        .Add({})),
      grad_norm(BuildGauge()
                    .Name("roundpipe_grad_norm")
                    .Help("Global gradient norm (before clipping) of the latest iteration")
                    .Register(r)
                    .Add({})),
      bubble_ratio(BuildGauge()
                       .Name("roundpipe_bubble_ratio")
                       .Help("Measured pipeline bubble ratio of the latest iteration (0..1)")
                       .Register(r)
                       .Add({})),
      batches_received(BuildCounter()
                           .Name("roundpipe_batches_received_total")
                           .Help("Batches accepted into a job's queue (streamed or read from a token file)")
                           .Register(r)
                           .Add({})),
      batches_rejected(BuildCounter()
                           .Name("roundpipe_batches_rejected_total")
                           .Help("Streamed batches rejected as invalid")
                           .Register(r)
                           .Add({})),
      checkpoint_failures(BuildCounter()
                              .Name("roundpipe_checkpoint_failures_total")
                              .Help("Checkpoints (policy, requested or drain) that could not be written")
                              .Register(r)
                              .Add({})),
      collective_seconds(BuildCounter()
                             .Name("roundpipe_collective_seconds_total")
                             .Help("Seconds this node spent inside collectives with the other nodes of cluster jobs")
                             .Register(r)
                             .Add({})),
      collective_bytes(BuildCounter()
                           .Name("roundpipe_collective_bytes_total")
                           .Help("fp32 bytes this node put into collectives of cluster jobs (the wire carries "
                                 "about (nodes-1)/nodes of them each way)")
                           .Register(r)
                           .Add({})),
      cluster_node_tokens_per_second(BuildGauge()
                                         .Name("roundpipe_cluster_node_tokens_per_second")
                                         .Help("A cluster job's coordinator: each node's latest tokens per second")
                                         .Register(r)),
      cluster_node_bubble_ratio(BuildGauge()
                                    .Name("roundpipe_cluster_node_bubble_ratio")
                                    .Help("A cluster job's coordinator: each node's latest pipeline bubble (0..1)")
                                    .Register(r)),
      cluster_node_collective_bytes(BuildGauge()
                                        .Name("roundpipe_cluster_node_collective_bytes")
                                        .Help("A cluster job's coordinator: the fp32 bytes each node has put "
                                              "into collectives so far")
                                        .Register(r)),
      worker_busy(BuildCounter()
                      .Name("roundpipe_worker_busy_seconds_total")
                      .Help("Seconds each worker's stream spent executing operations")
                      .Register(r)),
      transfer_bytes(BuildCounter()
                         .Name("roundpipe_transfer_bytes_total")
                         .Help("Bytes copied between host and devices, by direction and kind")
                         .Register(r)),
      host_memory(
          BuildGauge().Name("roundpipe_host_memory_bytes").Help("Host memory held by the engine, by pool").Register(r)),
      device_memory(BuildGauge()
                        .Name("roundpipe_device_memory_bytes")
                        .Help("Device memory in use, by device (0 on the CPU backend)")
                        .Register(r)),
      worker_state(BuildGauge()
                       .Name("roundpipe_worker_state")
                       .Help("Each worker's state in the pool (up, drained, lost): 1 for the one it is in")
                       .Register(r)),
      jobs(BuildGauge().Name("roundpipe_jobs").Help("Jobs known to the daemon, by state").Register(r)),
      build_info(BuildGauge().Name("roundpipe_build_info").Help("Always 1; labels carry versions").Register(r)),
      rpc_requests(BuildCounter()
                       .Name("roundpipe_rpc_requests_total")
                       .Help("gRPC calls finished, by method and status code")
                       .Register(r)),
      rpc_duration(BuildHistogram()
                       .Name("roundpipe_rpc_duration_seconds")
                       .Help("gRPC call duration (streams: their whole life), by method")
                       .Register(r)) {}

std::vector<std::string> DaemonMetrics::FamilyNames() {
  return {"roundpipe_tokens_trained_total",
          "roundpipe_iterations_total",
          "roundpipe_iteration_duration_seconds",
          "roundpipe_optimizer_step_seconds",
          "roundpipe_loss",
          "roundpipe_eval_loss",
          "roundpipe_evaluations_total",
          "roundpipe_learning_rate",
          "roundpipe_grad_norm",
          "roundpipe_bubble_ratio",
          "roundpipe_batches_received_total",
          "roundpipe_batches_rejected_total",
          "roundpipe_checkpoint_failures_total",
          "roundpipe_collective_seconds_total",
          "roundpipe_collective_bytes_total",
          "roundpipe_cluster_node_tokens_per_second",
          "roundpipe_cluster_node_bubble_ratio",
          "roundpipe_cluster_node_collective_bytes",
          "roundpipe_worker_busy_seconds_total",
          "roundpipe_transfer_bytes_total",
          "roundpipe_host_memory_bytes",
          "roundpipe_device_memory_bytes",
          "roundpipe_worker_state",
          "roundpipe_jobs",
          "roundpipe_build_info"};
}

}  // namespace rp::server
