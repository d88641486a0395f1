// The weights' upload of a stage slot (stage_state.h): priority-aware chunks between the running
// stage's input uploads (paper §4.2.2), with the async consistency edges of the upload.
#include <ATen/ATen.h>

#include "workers/stage_state.h"

namespace rp::workers::stage_internal {

std::vector<std::vector<TransferPiece>> PlanChunks(const std::vector<TensorExtent>& extents, int windows,
                                                   int64_t split_threshold_bytes) {
  auto plan = PlanTransferWindows(extents, std::max(1, windows), split_threshold_bytes);
  if (plan.ok()) return std::move(plan->windows);
  std::vector<std::vector<TransferPiece>> one(1);
  for (size_t t = 0; t < extents.size(); ++t) one[0].push_back({static_cast<int>(t), 0, extents[t].bytes});
  return one;
}

std::string Label(const StageTask& sl, const char* what, int mb) {
  const char* k = sl.kind == spec::StageKind::kForward ? "F" : sl.kind == spec::StageKind::kEval ? "E" : "B";
  std::string s = absl::StrCat(what, k, sl.stage);
  if (mb >= 0) absl::StrAppend(&s, " mb", mb);
  return s;
}

EventPtr EnqueueWeightUpload(Device& dev, const std::shared_ptr<StageState>& s, const std::vector<int>& owners,
                             const EventPtr& older_compute, const std::vector<EventPtr>& running_inputs) {
  const StageTask& task = s->task;
  const StageTask& sl = task;
  const bool trains = Trains(sl.kind);
  Stream& up = dev.stream(StreamKind::kParamUp);
  if (older_compute) up.WaitEvent(older_compute);  // bound: one stage prefetched
  if (task.book && sl.iteration >= 2) {
    // Edge (2): upload only weights already stepped with iteration T-2's gradients.
    auto prev2 = task.book->Get(sl.iteration - 2);
    for (int o : owners) up.WaitEvent(prev2->pcp[static_cast<size_t>(o)]);
  }
  // The stage's unique parameters (a tied head shares the embedding's), in layer order.
  {
    HostModelStore& store = *s->ctx->store;
    for (int l = sl.first_layer; l < sl.first_layer + sl.num_layers; ++l) {
      std::vector<int> idx;
      for (int id : store.layer_params(l)) {
        size_t k = 0;
        while (k < s->param_ids.size() && s->param_ids[k] != id) ++k;
        if (k == s->param_ids.size()) s->param_ids.push_back(id);
        idx.push_back(static_cast<int>(k));
      }
      s->layer_param_index.push_back(std::move(idx));
    }
  }
  // Priority-aware upload (paper §4.2.2): the weights go up in chunks, chunk j only after the
  // running stage's j-th input upload, so activation transfers (which gate compute) go first
  // and the weights fill the windows between them. Chunks are packed longest-processing-time
  // first; tensors larger than a fair share are split.
  std::vector<std::vector<TransferPiece>> chunks;
  if (!dev.keeps_weights_resident()) {
    std::vector<TensorExtent> extents;
    for (int id : s->param_ids) {
      const HostParam& p = s->ctx->store->param(id);
      extents.push_back({p.name, static_cast<int64_t>(p.master.nbytes())});
    }
    chunks = PlanChunks(extents, static_cast<int>(running_inputs.size()), /*split: fair share*/ 0);
  }
  auto params_ready = MakeEvent();
  up.Enqueue({}, [s] {
    Guarded(*s, "weight upload", [&] {
      HostModelStore& store = *s->ctx->store;
      // A re-run in async mode uploads the weights its iteration saw, which the optimizer may
      // have stepped since the first run's upload (retained_weights.h).
      const bool snapshot = s->attempt->rerun() && s->task.book != nullptr;
      for (int id : s->param_ids) {
        if (snapshot) s->sources.push_back(s->task.book->retained().Snapshot(store, id, s->task.iteration));
        const at::Tensor& m = store.param(id).master;
        s->params.push_back(s->dev->keeps_weights_resident() ? s->dev->Upload(m)
                                                             : s->dev->EmptyOnDevice(m.sizes(), m.scalar_type()));
      }
      // Paced workers run no math: no rotary tables (their sines cost milliseconds per stage).
      if (!s->dev->pacer()) s->rope = models::MakeRope(*s->ctx->cfg, s->ctx->seq_len, s->device);
    });
  });
  for (size_t w = 0; w < chunks.size(); ++w) {
    if (w < running_inputs.size()) up.WaitEvent(running_inputs[w]);
    up.Enqueue(
        {absl::StrCat(Label(sl, "up ", -1), " c", w), sl.iteration, sl.slot, -1}, [s, pieces = std::move(chunks[w])] {
          Guarded(*s, "weight upload", [&] {
            HostModelStore& store = *s->ctx->store;
            for (const TransferPiece& pc : pieces) {
              const size_t k = static_cast<size_t>(pc.tensor);
              const at::Tensor& master = s->sources.empty() ? store.param(s->param_ids[k]).master : s->sources[k];
              const at::Tensor src = master.reshape({-1}).view(at::kByte).narrow(0, pc.offset, pc.bytes);
              const at::Tensor dst =
                  s->params[static_cast<size_t>(pc.tensor)].view({-1}).view(at::kByte).narrow(0, pc.offset, pc.bytes);
              s->dev->CopyToDevice(src, dst);
            }
          });
        });
  }
  up.Enqueue({}, [s, trains] {
    Guarded(*s, "weight upload", [&] {
      HostModelStore& store = *s->ctx->store;
      for (size_t k = 0; k < s->param_ids.size(); ++k) {
        if (trains && store.param(s->param_ids[k]).trainable) s->params[k].requires_grad_(true);
      }
      s->weights.first_layer = s->task.first_layer;
      for (const std::vector<int>& idx : s->layer_param_index) {
        std::vector<at::Tensor> lw;
        for (int k : idx) lw.push_back(s->params[static_cast<size_t>(k)]);
        s->weights.layers.push_back(std::move(lw));
      }
      s->sources.clear();  // on the device now
    });
  });
  if (task.book) {
    // Counted even when the upload failed, so the optimizer never waits forever; once per slot
    // (a re-run's upload is not counted again).
    auto ev = task.book->Get(sl.iteration);
    up.Enqueue({}, [s, ev, first = sl.first_layer, n = sl.num_layers] {
      if (s->attempt->abandoned()) return;
      s->attempt->ledger().Once(SlotLedger::Effect::kCounted, 1, [&] {
        for (int l = first; l < first + n; ++l) ev->uploads[static_cast<size_t>(l)]->CountDown();
      });
    });
  }
  up.RecordEvent(params_ready);
  return params_ready;
}

}  // namespace rp::workers::stage_internal
