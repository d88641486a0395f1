#include "server/job_spec.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/engine.h"
#include "scheduler/job_files.h"
#include "server/job_spec_optimizer.h"
#include "server/paths.h"

namespace rp::server {

namespace v1 = roundpipe::v1;
using spec::ModelConfig;

absl::Status CheckFiniteNumbers(const google::protobuf::Message& msg, const std::string& prefix) {
  const google::protobuf::Descriptor* d = msg.GetDescriptor();
  const google::protobuf::Reflection* r = msg.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const std::string name = prefix.empty() ? std::string(f->name()) : absl::StrCat(prefix, ".", f->name());
    const int n = f->is_repeated() ? r->FieldSize(msg, f) : 1;
    for (int k = 0; k < n; ++k) {
      double v = 0;
      switch (f->cpp_type()) {
        case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
          v = f->is_repeated() ? r->GetRepeatedDouble(msg, f, k) : r->GetDouble(msg, f);
          break;
        case google::protobuf::FieldDescriptor::CPPTYPE_FLOAT:
          v = f->is_repeated() ? r->GetRepeatedFloat(msg, f, k) : r->GetFloat(msg, f);
          break;
        case google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE:
          if (f->is_repeated() || r->HasField(msg, f)) {
            const auto& sub = f->is_repeated() ? r->GetRepeatedMessage(msg, f, k) : r->GetMessage(msg, f);
            if (absl::Status st = CheckFiniteNumbers(sub, name); !st.ok()) return st;
          }
          continue;
        default:
          continue;
      }
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", v, " is not a finite number"));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<spec::ModelConfig> ResolveModel(const v1::ModelSpec& m, const JobSpecContext& ctx, std::string* hf_dir) {
  if (!m.hf_dir().empty()) {
    if (!m.preset().empty() || m.vocab() != 0 || m.hidden() != 0 || m.num_blocks() != 0) {
      return absl::InvalidArgumentError("model: give either hf_dir or a preset / explicit sizes, not both");
    }
    auto dir = ResolveInsideRoots(m.hf_dir(), ctx.allowed_roots, "model.hf_dir");
    if (!dir.ok()) return dir.status();
    auto c = scheduler::ReadHfModelConfig(*dir);
    if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat("model.hf_dir: ", c.status().message()));
    *hf_dir = *dir;
    return *c;
  }
  spec::ModelConfig c;
  if (!m.preset().empty()) {
    auto p = planning::ModelPreset(m.preset());
    if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat("model.preset: ", p.status().message()));
    c = *p;
    c.lora = {};  // the job's own LoRA settings apply (the paper's presets carry theirs for the planner)
    c.lora.rank = 0;
  } else if (m.vocab() == 0 && m.hidden() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("model: give a preset (",
                                                   absl::StrJoin(planning::ModelPresetNames(), ", "),
                                                   ") or explicit sizes (vocab, hidden, intermediate, num_blocks, "
                                                   "num_heads, num_kv_heads, head_dim)"));
  }
  if (!m.family().empty()) {
    if (m.family() != "llama" && m.family() != "qwen3") {
      return absl::InvalidArgumentError(absl::StrCat("model.family: '", m.family(), "' (expected llama or qwen3)"));
    }
    c.family = m.family();
    c.qk_norm = c.family == "qwen3";
  }
  auto set64 = [](int64_t v, int64_t* dst, const char* field) -> absl::Status {
    if (v < 0) return absl::InvalidArgumentError(absl::StrCat("model.", field, ": must be positive, got ", v));
    if (v > 0) *dst = v;
    return absl::OkStatus();
  };
  auto set32 = [](int32_t v, int* dst, const char* field) -> absl::Status {
    if (v < 0) return absl::InvalidArgumentError(absl::StrCat("model.", field, ": must be positive, got ", v));
    if (v > 0) *dst = v;
    return absl::OkStatus();
  };
  for (absl::Status st :
       {set64(m.vocab(), &c.vocab, "vocab"), set64(m.hidden(), &c.hidden, "hidden"),
        set64(m.intermediate(), &c.intermediate, "intermediate"), set32(m.num_blocks(), &c.num_blocks, "num_blocks"),
        set32(m.num_heads(), &c.num_heads, "num_heads"), set32(m.num_kv_heads(), &c.num_kv_heads, "num_kv_heads"),
        set64(m.head_dim(), &c.head_dim, "head_dim"),
        set64(m.rope_original_max_position(), &c.rope_scaling.original_max_position, "rope_original_max_position")}) {
    if (!st.ok()) return st;
  }
  if (m.rope_theta() < 0 || m.rms_eps() < 0 || m.rope_scaling_factor() < 0) {
    return absl::InvalidArgumentError("model: rope_theta, rms_eps and rope_scaling_factor must not be negative");
  }
  if (m.rope_theta() > 0) c.rope_theta = m.rope_theta();
  if (m.rms_eps() > 0) c.rms_eps = m.rms_eps();
  if (m.tied_embeddings()) c.tied_embeddings = true;
  if (m.rope_scaling_factor() > 0) {
    c.rope_scaling.factor = m.rope_scaling_factor();
    if (m.rope_low_freq_factor() > 0) c.rope_scaling.low_freq_factor = m.rope_low_freq_factor();
    if (m.rope_high_freq_factor() > 0) c.rope_scaling.high_freq_factor = m.rope_high_freq_factor();
  }
  if (absl::Status st = c.Validate(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", st.message()));
  }
  return c;
}

}  // namespace

namespace {

// name, model (preset, HF dir or sizes), LoRA, precision and the host-memory admission.
absl::Status ResolveModelAndPrecision(const v1::JobSpec& spec, const JobSpecContext& ctx, ResolvedJob& r) {
  if (absl::Status st = CheckFiniteNumbers(spec, ""); !st.ok()) return st;
  scheduler::JobSpec& e = r.engine;
  e.name = spec.name().empty() ? "job" : spec.name();
  if (e.name.size() > 200) return absl::InvalidArgumentError("name: at most 200 characters");
  auto model = ResolveModel(spec.model(), ctx, &e.hf_dir);
  if (!model.ok()) return model.status();
  e.model = *model;
  if (spec.model().has_router_aux_loss_coef()) {
    const double coef = spec.model().router_aux_loss_coef();
    if (coef < 0) return absl::InvalidArgumentError("model.router_aux_loss_coef: must be >= 0 (0 = off)");
    if (coef > 0 && !e.model.is_moe()) {
      return absl::InvalidArgumentError("model.router_aux_loss_coef: the model has no experts (no router)");
    }
    e.model.router_aux_loss_coef = coef;
  }
  const v1::LoraSpec& lora = spec.model().lora();
  if (lora.rank() < 0 || lora.alpha() < 0) return absl::InvalidArgumentError("model.lora: rank and alpha must be >= 0");
  if (lora.rank() > 0) {
    e.model.lora.rank = lora.rank();
    e.model.lora.alpha = lora.alpha() > 0 ? lora.alpha() : 16;
    e.model.lora.targets.assign(lora.target_modules().begin(), lora.target_modules().end());
    if (e.model.lora.targets.empty()) e.model.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
    if (absl::Status st = e.model.Validate(); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model.lora: ", st.message()));
    }
    if (!lora.adapter_dir().empty()) {
      auto dir = ResolveInsideRoots(lora.adapter_dir(), ctx.allowed_roots, "model.lora.adapter_dir");
      if (!dir.ok()) return dir.status();
      e.lora_adapter_dir = *dir;
    }
  } else if (!lora.adapter_dir().empty() || lora.target_modules_size() > 0) {
    return absl::InvalidArgumentError("model.lora: give a rank > 0 with target_modules / adapter_dir");
  }
  e.seed = spec.model().init_seed();
  switch (spec.precision()) {
    case v1::PRECISION_UNSPECIFIED:
    case v1::PRECISION_BF16:
      e.precision = scheduler::Precision::kBFloat16;
      break;
    case v1::PRECISION_FP32:
      e.precision = scheduler::Precision::kFloat32;
      break;
    case v1::PRECISION_FP16:
      e.precision = scheduler::Precision::kFloat16;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("precision: unknown value ", spec.precision()));
  }
  return absl::OkStatus();
}

// global batch, micro-batches, sequence length and the round structure.
absl::Status ResolveBatching(const v1::JobSpec& spec, const JobSpecContext& ctx, ResolvedJob& r) {
  scheduler::JobSpec& e = r.engine;
  const v1::BatchingSpec& b = spec.batching();
  if (b.global_batch() < 0 || b.micro_batch() < 0 || b.sequence_length() < 0 || b.microbatches_per_round() < -1) {
    return absl::InvalidArgumentError(
        "batching: sizes must not be negative (microbatches_per_round -1: chosen with the automatic partition)");
  }
  constexpr int64_t kMaxGlobalBatch = int64_t{1} << 20;
  if (b.global_batch() > kMaxGlobalBatch || b.micro_batch() > kMaxGlobalBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("batching: global_batch and micro_batch must be at most ", kMaxGlobalBatch));
  }
  const int64_t micro = b.micro_batch() > 0 ? b.micro_batch() : 1;
  r.global_batch = b.global_batch() > 0 ? b.global_batch() : micro * ctx.num_devices;
  r.sequence_length = b.sequence_length() > 0 ? b.sequence_length() : 256;
  if (r.global_batch % micro != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batching: global_batch ", r.global_batch, " is not a multiple of micro_batch ", micro));
  }
  if (r.sequence_length > (int64_t{1} << 20)) return absl::InvalidArgumentError("batching: sequence_length above 1M");
  constexpr int64_t kMaxStepTokens = int64_t{1} << 28;
  if (r.global_batch * r.sequence_length > kMaxStepTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("batching: global_batch x sequence_length = ", r.global_batch * r.sequence_length,
                     " tokens per step, above ", kMaxStepTokens));
  }
  // A cluster job: each node runs its share of the global batch (JobSpec.cluster).
  if (ctx.nodes > 1 && r.global_batch % (ctx.nodes * micro) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batching: global_batch ", r.global_batch, " over ", ctx.nodes,
                     " nodes must be a multiple of nodes x micro_batch = ", ctx.nodes * micro));
  }
  e.microbatches = static_cast<int>(r.global_batch / std::max(ctx.nodes, 1) / micro);
  if (e.microbatches < ctx.num_devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("batching: global_batch / ", ctx.nodes > 1 ? absl::StrCat(ctx.nodes, " nodes / ") : "",
                     "micro_batch = ", e.microbatches, " micro-batches, fewer than the ", ctx.num_devices,
                     " devices; raise global_batch or lower micro_batch"));
  }
  e.microbatches_per_round = b.microbatches_per_round();
  if (e.microbatches_per_round == -1 && spec.partition().fused() > 0) {
    return absl::InvalidArgumentError(
        "batching.microbatches_per_round: -1 (chosen with the automatic partition) needs no fixed partition");
  }
  if (e.microbatches_per_round > 0 &&
      (e.microbatches_per_round < ctx.num_devices || e.microbatches % e.microbatches_per_round != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("batching.microbatches_per_round: must be >= ", ctx.num_devices,
                                                   " (devices) and divide the ", e.microbatches, " micro-batches"));
  }
  return absl::OkStatus();
}

// an explicit partition (checked against the model's layers) or the automatic one.
absl::Status ResolvePartition(const v1::JobSpec& spec, const JobSpecContext& ctx, ResolvedJob& r) {
  scheduler::JobSpec& e = r.engine;
  const v1::PartitionSpec& p = spec.partition();
  if (p.fused() > 0) {
    planning::Partition part;
    part.forward.assign(p.forward().begin(), p.forward().end());
    part.fused = p.fused();
    part.backward.assign(p.backward().begin(), p.backward().end());
    int fwd = 0, bwd = part.fused;
    for (int x : part.forward) fwd += x;
    for (int x : part.backward) bwd += x;
    for (int x : part.forward) {
      if (x < 1) return absl::InvalidArgumentError("partition.forward: every stage needs >= 1 layer");
    }
    for (int x : part.backward) {
      if (x < 1) return absl::InvalidArgumentError("partition.backward: every stage needs >= 1 layer");
    }
    const int L = e.model.num_layers();
    if (fwd + part.fused != L || bwd != L) {
      return absl::InvalidArgumentError(
          absl::StrCat("partition: forward + fused must cover the ", L, " layers (embedding, ", e.model.num_blocks,
                       " blocks, head) and fused + backward too; got ", fwd, " + ", part.fused, " and ", bwd));
    }
    e.partition = part;
  } else if (!p.forward().empty() || !p.backward().empty()) {
    return absl::InvalidArgumentError("partition: give fused (B_1's layer count) with forward/backward, or nothing");
  } else {
    e.auto_partition = true;
  }
  if (p.min_stages() != 0 || p.t_max_window() != 0) {
    if (!e.auto_partition) {
      return absl::InvalidArgumentError(
          "partition: min_stages and t_max_window steer the automatic partition; leave them out with layer counts");
    }
    const int L = e.model.num_layers();
    if (p.min_stages() < 0 || p.min_stages() > 2 * L - 1) {
      return absl::InvalidArgumentError(absl::StrCat("partition.min_stages: ", p.min_stages(), " is outside 0..",
                                                     2 * L - 1, " (", L, " layers make at most ", 2 * L - 1,
                                                     " stage slots)"));
    }
    if (p.t_max_window() != 0 && !(p.t_max_window() >= 1 && std::isfinite(p.t_max_window()))) {
      return absl::InvalidArgumentError(absl::StrCat("partition.t_max_window: ", p.t_max_window(),
                                                     " must be >= 1 (slowest slot within that factor of the "
                                                     "least possible) or 0 (no window)"));
    }
    e.partition_min_stages = p.min_stages();
    e.partition_t_max_window = p.t_max_window();
  }
  return absl::OkStatus();
}

// devices, the checkpoint policy, step limit, priority and the queue bound.
absl::Status ResolveRun(const v1::JobSpec& spec, const JobSpecContext& ctx, ResolvedJob& r) {
  scheduler::JobSpec& e = r.engine;
  if (!spec.devices().empty() && spec.devices() != "auto" && spec.devices() != ctx.daemon_devices) {
    return absl::FailedPreconditionError(absl::StrCat("devices: this daemon runs every job on all its devices (",
                                                      ctx.daemon_devices,
                                                      "); leave devices empty (or \"auto\") or name exactly those"));
  }
  if (spec.checkpoint().every_steps() < 0 || spec.checkpoint().keep_last() < 0 ||
      spec.checkpoint().keep_last() > 1000) {
    return absl::InvalidArgumentError("checkpoint: every_steps must not be negative, keep_last in [0, 1000]");
  }
  e.checkpoint_every = spec.checkpoint().every_steps();
  e.checkpoint_keep_last = spec.checkpoint().keep_last() > 0 ? spec.checkpoint().keep_last() : 3;
  if (spec.max_steps() < 0) return absl::InvalidArgumentError("max_steps: must not be negative");
  e.max_steps = spec.max_steps();
  e.priority = spec.priority();
  if (spec.share() != 0 && !(spec.share() > 0 && spec.share() <= 1000)) {  // NaN fails too
    return absl::InvalidArgumentError(absl::StrCat("share: must lie in (0, 1000] (got ", spec.share(), ")"));
  }
  e.share = spec.share() != 0 ? spec.share() : 1;
  e.max_queued_batches = ctx.max_queued_batches;
  return absl::OkStatus();
}

// One server-side data file (`field`: "data.token_file" or "data.validation").
absl::StatusOr<scheduler::TokenFileSource> ResolveTokenFile(const v1::DataSource::TokenFile& tf,
                                                            const std::string& field, const JobSpecContext& ctx,
                                                            const ResolvedJob& r) {
  auto path = ResolveInsideRoots(tf.path(), ctx.allowed_roots, field + ".path");
  if (!path.ok()) return path.status();
  scheduler::TokenFileSource src;
  src.path = *path;
  switch (tf.format()) {
    case v1::DataSource::TokenFile::FORMAT_BIN_UINT16:
      src.format = scheduler::TokenFileSource::Format::kBinUint16;
      break;
    case v1::DataSource::TokenFile::FORMAT_BIN_UINT32:
      src.format = scheduler::TokenFileSource::Format::kBinUint32;
      break;
    case v1::DataSource::TokenFile::FORMAT_NPY:
      src.format = scheduler::TokenFileSource::Format::kNpy;
      break;
    case v1::DataSource::TokenFile::FORMAT_JSONL:
      src.format = scheduler::TokenFileSource::Format::kJsonl;
      break;
    case v1::DataSource::TokenFile::FORMAT_TOKEN_DATASET:
      src.format = scheduler::TokenFileSource::Format::kTokenDataset;
      break;
    default:
      src.format = scheduler::TokenFileSource::Format::kAuto;
  }
  switch (tf.packing()) {
    case v1::DataSource::TokenFile::PACKING_UNSPECIFIED:
    case v1::DataSource::TokenFile::PACKING_CONCATENATE:
      src.packing = scheduler::TokenFileSource::Packing::kConcatenate;
      break;
    case v1::DataSource::TokenFile::PACKING_DOCUMENT_MASKED:
      src.packing = scheduler::TokenFileSource::Packing::kDocumentMasked;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(field, ".packing: unknown value ", tf.packing()));
  }
  if (tf.max_epochs() < 0) return absl::InvalidArgumentError(field + ".max_epochs: must not be negative");
  src.max_epochs = tf.max_epochs() > 0 ? tf.max_epochs() : 1;
  if (!tf.tokenizer_dir().empty()) {
    auto dir = ResolveInsideRoots(tf.tokenizer_dir(), ctx.allowed_roots, field + ".tokenizer_dir");
    if (!dir.ok()) return dir.status();
    src.tokenizer_dir = *dir;
  }
  src.eos_token = tf.eos_token();
  src.shuffle = tf.shuffle();
  src.shuffle_seed = tf.shuffle_seed();
  src.global_batch = r.global_batch;
  src.sequence_length = r.sequence_length;
  return src;
}

// a streamed job (its batches must fit a message) or a server-side token file; the validation
// data and the evaluation policy.
absl::Status ResolveData(const v1::JobSpec& spec, const JobSpecContext& ctx, ResolvedJob& r) {
  scheduler::JobSpec& e = r.engine;
  switch (spec.data().source_case()) {
    case v1::DataSource::kTokenFile: {
      auto src = ResolveTokenFile(spec.data().token_file(), "data.token_file", ctx, r);
      if (!src.ok()) return src.status();
      e.token_file = *src;
      break;
    }
    case v1::DataSource::kStream:
    case v1::DataSource::SOURCE_NOT_SET:
      break;
  }
  if (spec.data().has_validation()) {
    auto src = ResolveTokenFile(spec.data().validation(), "data.validation", ctx, r);
    if (!src.ok()) return src.status();
    e.validation = *src;
  }
  const v1::EvalPolicy& ev = spec.eval();
  if (ev.every_steps() < 0) return absl::InvalidArgumentError("eval.every_steps: must not be negative");
  if (ev.early_stopping_patience() < 0) {
    return absl::InvalidArgumentError("eval.early_stopping_patience: must not be negative");
  }
  if (spec.has_eval() && !spec.data().has_validation()) {
    return absl::InvalidArgumentError("eval: needs validation data (data.validation)");
  }
  e.eval.every_steps = ev.every_steps();
  e.eval.early_stopping_patience = ev.early_stopping_patience();
  e.eval.keep_best_checkpoint = ev.keep_best_checkpoint();
  e.eval.samples = ToSamples(ev.samples());
  if (r.streamed() && ctx.max_message_bytes > 0) {
    // A streamed batch is one message: packed varint token ids (< vocab) plus a packed bool mask.
    int64_t id_bytes = 1;
    for (int64_t v = e.model.vocab - 1; v >= 128; v >>= 7) ++id_bytes;
    const int64_t need = r.global_batch * r.sequence_length * (id_bytes + 1) + 256;
    if (need > ctx.max_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batching: a streamed batch of global_batch x sequence_length = ", r.global_batch * r.sequence_length,
          " tokens needs up to ", need, " bytes, above this daemon's max_message_bytes (", ctx.max_message_bytes,
          "); lower global_batch or sequence_length, use a token file, or raise maxMessageBytes"));
    }
  }
  return absl::OkStatus();
}

// the output directory (inside the allowed roots) and the checkpoints under it.
absl::Status ResolveOutput(const v1::JobSpec& spec, const JobSpecContext& ctx, ResolvedJob& r) {
  scheduler::JobSpec& e = r.engine;
  if (!spec.output_dir().empty()) {
    auto out = ResolveInsideRoots(spec.output_dir(), ctx.allowed_roots, "output_dir");
    if (!out.ok()) return out.status();
    r.output_dir = *out;
  } else {
    r.output_dir = ctx.default_output_dir;
  }
  e.checkpoint_root = r.output_dir + "/checkpoints";
  e.profile_path = r.output_dir + "/profile.json";
  return absl::OkStatus();
}

}  // namespace

scheduler::EvalPolicy::Samples ToSamples(const v1::SamplePolicy& p) {
  scheduler::EvalPolicy::Samples s;
  s.prompts.assign(p.prompts().begin(), p.prompts().end());
  s.max_new_tokens = p.max_new_tokens() != 0 ? p.max_new_tokens() : 32;
  s.temperature = p.temperature();
  s.seed = p.seed();
  return s;
}

absl::StatusOr<ResolvedJob> ResolveJobSpec(const v1::JobSpec& spec, const JobSpecContext& ctx) {
  ResolvedJob r;
  for (auto step : {ResolveModelAndPrecision, ResolveOptimizer, ResolveBatching, ResolvePartition, ResolveRun,
                    ResolveData, ResolveOutput}) {
    if (absl::Status st = step(spec, ctx, r); !st.ok()) return st;
  }
  // Admission, once the layout is known (precision, optimizer state, mode, where the base lives).
  if (ctx.host_memory_budget) {
    auto need = scheduler::PredictHostStateBytes(r.engine);
    if (!need.ok()) return absl::InvalidArgumentError(absl::StrCat("model.hf_dir: ", need.status().message()));
    const int64_t budget = ctx.host_memory_budget();
    if (*need > budget) {
      return absl::ResourceExhaustedError(absl::StrCat("model: needs about ", *need >> 20,
                                                       " MiB of host memory for its states, the daemon has ",
                                                       budget >> 20, " MiB available now; choose a smaller model"));
    }
  }
  return r;
}

}  // namespace rp::server
