#include "scheduler/runtime/engine_job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/runtime/model_adapter.h"
#include "workers/files/atomic_dir.h"
#include "workers/files/confined_fs.h"
#include "workers/io/checkpoint.h"

namespace rp::scheduler::runtime {

void EngineJob::ReportCheckpoint(const absl::StatusOr<CheckpointInfo>& info, int64_t step) {
  if (info.ok()) {
    JobEvent e{JobEvent::Kind::kCheckpoint, state, {}, ""};
    e.checkpoint = *info;
    Emit(e);
    return;
  }
  JobEvent e{JobEvent::Kind::kCheckpointFailed, state, {}, ""};
  e.message = absl::StrCat("checkpoint at step ", step, " failed: ", info.status().message());
  e.checkpoint.step = step;
  Emit(e);
}

namespace {

// Writes the job's state as <root>/step-<step> (the caller ensures an iteration boundary with
// the optimizer flushed) and keeps the newest `keep_last`. A checkpoint of that step that
// exists already holds this very state: it is returned as is. `eval`: the job's evaluations so
// far, recorded in meta.json; its best checkpoint is never pruned.
absl::StatusOr<CheckpointInfo> WriteJobCheckpoint(const workers::HostModelStore& store, const Controller& c,
                                                  bool on_every_node, const workers::io::FrozenBase& base, int64_t step,
                                                  int64_t consumed, const std::string& root, int keep_last,
                                                  const std::string& note, const std::string& optimizer,
                                                  const std::optional<files::CheckpointMeta::Eval>& eval) {
  const std::string keep = eval ? eval->best_checkpoint : "";
  if (root.empty()) return absl::FailedPreconditionError("the job has no checkpoint directory");
  const std::string dir = absl::StrCat(root, "/step-", step);
  if (files::KindOf(dir + "/meta.json") == files::FileKind::kFile) return CheckpointInfo{dir, step, consumed};
  OptimizerSnapshot snap = c.Snapshot();
  if (workers::DataParallelGroup* g = c.data_parallel(); g != nullptr && g->sharded()) {
    // Its moments are spread over the nodes: whole again for the checkpoint, from every node at
    // once (a checkpoint one node takes alone would wait for the others in vain).
    if (!on_every_node) {
      return absl::FailedPreconditionError(
          "a data-parallel job whose optimizer state is sharded checkpoints only where every node does (every "
          "checkpoint_every steps, and its end when it succeeds)");
    }
    if (absl::Status st = workers::GatherShardedState(*g, store, &snap.adamw); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("gathering the sharded optimizer state: ", st.message()));
    }
  }
  files::CheckpointMeta meta;
  meta.step = step;
  meta.batches_consumed = consumed;
  meta.loss_scale = snap.loss_scale;
  meta.good_steps = snap.good_steps;
  meta.forward = c.partition().forward;
  meta.fused = c.partition().fused;
  meta.backward = c.partition().backward;
  meta.note = note;
  meta.optimizer = optimizer;
  meta.eval = eval;
  if (absl::Status st = workers::io::WriteCheckpoint(dir, store, snap.adamw, meta, &base); !st.ok()) return st;
  // Pruning never follows a symlink and stays beneath the daemon's roots (confined_fs).
  const auto all = workers::io::ListCheckpoints(root);
  for (size_t i = static_cast<size_t>(std::max(keep_last, 1)); i < all.size(); ++i) {
    if (all[i] != keep) (void)files::RemoveTree(all[i]);
  }
  // Temporaries torn by a crash mid-write (the job's writes are serialised by run_mu: none is live).
  if (auto names = files::ListDir(root); names.ok()) {
    for (const std::string& n : *names) {
      if (files::IsAtomicDirTemporary(n)) (void)files::RemoveTree(root + "/" + n);
    }
  }
  return CheckpointInfo{dir, step, consumed};
}

}  // namespace

absl::StatusOr<CheckpointInfo> EngineJob::CheckpointNow(const std::string& note, bool report_existing,
                                                        bool on_every_node) {
  int64_t step, cursor;
  std::optional<files::CheckpointMeta::Eval> eval;
  {
    base::MutexLock lock(&mu);
    step = first_step + steps_done;
    cursor = consumed_offset + consumed;
    if (last_eval) {
      eval = files::CheckpointMeta::Eval{last_eval->step,      last_eval->loss,      last_eval->tokens,
                                         last_eval->best_loss, last_eval->best_step, evals_without_improvement,
                                         best_checkpoint};
    }
  }
  const bool existed =
      !spec.checkpoint_root.empty() &&
      files::KindOf(absl::StrCat(spec.checkpoint_root, "/step-", step, "/meta.json")) == files::FileKind::kFile;
  if (!frozen_base) frozen_base = workers::io::DescribeFrozenBase(*store);  // once: the base never changes
  auto info = WriteJobCheckpoint(*store, *controller, on_every_node, *frozen_base, step, cursor, spec.checkpoint_root,
                                 spec.checkpoint_keep_last, note, spec::OptimizerName(spec.optimizer.algorithm), eval);
  base::MutexLock lock(&mu);
  if (report_existing || !existed || !info.ok()) ReportCheckpoint(info, step);
  return info;
}

// The fp32 value of a parameter (caller holds run_mu): from the store, or once released from
// the final checkpoint.
absl::StatusOr<at::Tensor> EngineJob::ReadParameter(const std::string& name) {
  if (!store) {  // not built yet, or released: read the final checkpoint
    if (final_checkpoint.empty()) {
      base::MutexLock lock(&mu);
      if (!terminal()) {
        return absl::FailedPreconditionError(absl::StrCat("job ", id, " has not started; its weights are not loaded"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " ended without weights to keep (it failed, or was cancelled before it started)"));
    }
    if (!final_weights) {
      auto f = workers::io::SafetensorsFile::Open(final_checkpoint + "/weights.safetensors");
      if (!f.ok()) return f.status();
      final_weights = std::move(*f);
    }
    if (final_weights->Find(name)) return final_weights->Read(name, at::kFloat);
    if (!final_base) {  // adapter-only checkpoints describe the base instead of storing it
      auto base = workers::io::ReadCheckpointBase(final_checkpoint);
      if (!base.ok()) return base.status();
      final_base = std::make_unique<BaseSource>(model, dtype, spec.hf_dir, spec.seed, std::move(*base));
    }
    if (!final_base->Has(name)) return absl::NotFoundError(absl::StrCat("job ", id, " has no parameter ", name));
    auto v = final_base->Read(name);
    if (!v.ok()) return absl::Status(v.status().code(), absl::StrCat("job ", id, ": ", v.status().message()));
    return v;
  }
  const int i = store->FindParam(name);
  if (i < 0) return absl::NotFoundError(absl::StrCat("job ", id, " has no parameter ", name));
  const workers::HostParam& p = store->param(i);
  return p.fp32.defined() ? p.fp32 : p.master.to(at::kFloat);  // frozen (LoRA base): master only
}

}  // namespace rp::scheduler::runtime
