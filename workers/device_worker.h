// device_worker.h — a stateless worker on one device (paper §3.1, §4.1): executes one stage slot
// of the DispatchPlan for all micro-batches of a round by enqueuing operations on the device's
// five streams:
//   param-up:  upload the stage's weights (master copy) into stage-private device tensors;
//   act-up:    per micro-batch, wait for its input on host (ActivationStore) and upload it,
//              at most one micro-batch ahead of compute;
//   compute:   per micro-batch, run the stage (forward / fused B_1 / backward);
//   act-down:  per micro-batch, download outputs (next stage's input, checkpoints, input grads);
//   grad-down: after the last micro-batch (the weights are freed then, their gradients kept),
//              download the gradients into the host fp32 buffers — in chunks between the
//              activation downloads of the next stage submitted to this worker (paper §4.2.2).
// Nothing survives the stage: weights, inputs and gradients are released when it completes.
//
// Contract: Submit and Flush are called from one thread (the controller) in dispatch order;
// they return at once. The returned event is set when the stage has fully finished (also on
// failure: errors go to the RunContext) — for a training stage that needs the next Submit to
// this worker or a Flush, which issue its gradient download: call Flush when no further stage
// follows for now (the controller does after each iteration's dispatch), before waiting on the
// events. At most one further stage's weights are uploaded ahead of compute.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "workers/consistency.h"
#include "workers/device/device.h"
#include "workers/run_context.h"
#include "workers/slot_attempt.h"
#include "workers/stage_task.h"

namespace rp::workers {

class DeviceWorker {
 public:
  explicit DeviceWorker(Device* device) : device_(device) {}
  Device* device() const { return device_; }
  // `attempt`: this run of the slot (slot_attempt.h; the controller's, to re-run the slot
  // elsewhere should this device be lost); null: a run of its own. The event is set once the run
  // drained: the slot finished (attempt->ledger().done() set too) — or its device was lost.
  EventPtr Submit(const StageTask& task, std::shared_ptr<RunContext> ctx,
                  std::shared_ptr<SlotAttempt> attempt = nullptr);
  // Issues the last training stage's gradient download without waiting for a next stage.
  void Flush();

 private:
  Device* device_;
  // Compute-finished events of the last two stages: the next upload waits for the older one,
  // so at most one stage is prefetched while one runs.
  EventPtr compute_done_[2];
  // Input-upload events of the previously submitted stage (the one running while the next
  // stage's weights go up): weight chunk j is issued after its input j.
  std::vector<EventPtr> prev_inputs_uploaded_;
  // The last training stage's gradient download, waiting for the next stage's activation-download
  // events to interleave with (called with them by the next Submit, with none by Flush).
  std::function<void(const std::vector<EventPtr>&)> pending_grads_;
};

// A slot whose iteration failed and that no worker will run (every device lost): counts it in the
// consistency protocol as if it had run (so no optimizer step waits forever) and completes its
// ledger.
void SettleSlot(const StageTask& task, SlotLedger& ledger);

}  // namespace rp::workers
