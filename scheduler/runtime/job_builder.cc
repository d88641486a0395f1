#include "scheduler/runtime/job_builder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/runtime/job_samples.h"
#include "scheduler/runtime/jsonl_documents.h"
#include "scheduler/runtime/model_adapter.h"
#include "scheduler/runtime/token_dataset_file.h"
#include "workers/data_parallel.h"
#include "workers/files/confined_fs.h"
#include "workers/io/checkpoint.h"
#include "workers/io/hf_config.h"
#include "workers/io/hf_tensors.h"

namespace rp::scheduler {

absl::StatusOr<planning::Partition> PlanFromParameterSizes(const spec::ModelConfig& model, int num_workers,
                                                           int microbatches) {
  planning::CostModel costs;
  for (int l = 0; l < model.num_layers(); ++l) {
    planning::LayerCost c;
    // The embedding is a lookup, not a matmul: count it as one row per token, i.e. cheap. The
    // head's matmul costs its weight even when it is tied to the embedding.
    const double work = l == 0                        ? static_cast<double>(model.hidden)
                        : l == model.num_layers() - 1 ? static_cast<double>(model.vocab * model.hidden + model.hidden)
                                                      : static_cast<double>(model.LayerParams(l));
    c.fwd_s = work;
    c.bwd_s = 3 * work;
    c.fused_s = 3 * work;
    costs.layers.push_back(c);
  }
  auto r = planning::AutoPartition({&costs, num_workers, microbatches, 0});
  if (!r.ok()) return r.status();
  return r->partition;
}

int64_t DefaultStageMemoryCap(const std::vector<workers::Device*>& devices) {
  std::map<std::string, int> sharing;  // physical device -> workers on it
  for (workers::Device* d : devices) ++sharing[d->torch_device().str()];
  int64_t cap = 0;
  for (workers::Device* d : devices) {
    const int64_t total = d->Memory().device_total_bytes;
    if (total <= 0) return 0;
    const int64_t share = total / sharing[d->torch_device().str()] * 9 / 10 / 2;
    cap = cap == 0 ? share : std::min(cap, share);
  }
  return cap;
}

}  // namespace rp::scheduler

namespace rp::scheduler::runtime {

namespace {

// Where data-parallel groups of this process find each other (DataParallelSpec).
spec::InMemoryStore& ProcessRendezvousStore() {
  static auto* store = new spec::InMemoryStore();
  return *store;
}

// JobSpec::data_parallel's rules (Submit).
absl::Status CheckDataParallel(const JobSpec& spec) {
  if (!spec.data_parallel) return absl::OkStatus();
  const DataParallelSpec& dp = *spec.data_parallel;
  if (dp.size < 2 || dp.size > 4096 || dp.rank < 0 || dp.rank >= dp.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_parallel: node ", dp.rank, " of ", dp.size, " (2 to 4096 nodes, rank below size)"));
  }
  if (dp.group.empty()) return absl::InvalidArgumentError("data_parallel.group: name the job's group");
  if (dp.timeout_ms < 100) return absl::InvalidArgumentError("data_parallel.timeout_ms: at least 100");
  if (dp.shard_token_file && !spec.token_file) {
    return absl::InvalidArgumentError("data_parallel.shard_token_file: the job reads no token file");
  }
  // Not across nodes yet: an evaluation's sums, and the router's load-balancing loss (its
  // statistics are the whole batch's, which no node holds).
  if (spec.validation) return absl::InvalidArgumentError("data_parallel: evaluation (data.validation) not yet");
  if (spec.model.router_aux_loss_coef > 0) {
    return absl::InvalidArgumentError("data_parallel: a router auxiliary loss (MoE) not yet");
  }
  return absl::OkStatus();
}

// Joins the job's data-parallel group (BuildJob), the optimizer state sharded over the store's
// trainable parameters when asked.
absl::StatusOr<std::shared_ptr<workers::DataParallelGroup>> StartDataParallel(const DataParallelSpec& dp,
                                                                              const std::string& binary,
                                                                              spec::RendezvousStore* rendezvous,
                                                                              const std::atomic<bool>* cancel,
                                                                              const workers::HostModelStore& store) {
  workers::DataParallelOptions o;
  o.rank = dp.rank;
  o.size = dp.size;
  o.group = dp.group;
  o.hostname = dp.hostname;
  o.binary = binary;
  o.timeout = std::chrono::milliseconds(dp.timeout_ms);
  o.shard_optimizer_state = dp.shard_optimizer_state;
  o.bf16_gradients = dp.bf16_gradients;
  o.cancel = cancel;
  auto group = workers::DataParallelGroup::Start(o, rendezvous ? rendezvous : &ProcessRendezvousStore());
  if (!group.ok()) return group.status();
  if (dp.shard_optimizer_state) (*group)->AssignOwners(workers::OwnerElements(store));
  return group;
}

}  // namespace
namespace {

bool IsJsonl(const TokenFileSource& tf) {
  return tf.format == TokenFileSource::Format::kJsonl ||
         (tf.format == TokenFileSource::Format::kAuto && absl::EndsWith(tf.path, ".jsonl"));
}
bool IsTokenDatasetFile(const TokenFileSource& tf) {
  return tf.format == TokenFileSource::Format::kTokenDataset ||
         (tf.format == TokenFileSource::Format::kAuto && absl::EndsWith(tf.path, ".safetensors"));
}

// This node's share of the training file's batches (DataParallelSpec::shard_token_file):
// {rank, size}; {0, 1}: all of each batch.
std::pair<int, int> TrainingShare(const JobSpec& spec) {
  if (!spec.data_parallel || !spec.data_parallel->shard_token_file) return {0, 1};
  return {spec.data_parallel->rank, spec.data_parallel->size};
}

// A data source (`field`: "data.token_file" or "data.validation"), checked at Submit: a JSONL
// file's tokenizer (its ids within the model's vocabulary) and readability, a token dataset's
// header, or a raw token file opened (mapped, not read: `*raw`); read and tokenized by BuildJob
// when the job starts (LoadPackedSource), so a queued job holds nothing.
// `share`: the node's rows of each batch (TrainingShare).
absl::Status PrepareSource(TokenFileSource& tf, const JobSpec& spec, EngineJob* job, const std::string& field,
                           std::unique_ptr<TokenDataset>* raw, std::pair<int, int> share = {0, 1}) {
  auto bad = [&](absl::string_view why) { return absl::InvalidArgumentError(absl::StrCat(field, ": ", why)); };
  // A file's error, named by field: PermissionDenied outside the roots stays so (DAEMON.md's
  // status codes), anything else about the file is InvalidArgument.
  auto failed = [&](const absl::Status& st) {
    const bool denied = st.code() == absl::StatusCode::kPermissionDenied;
    return absl::Status(denied ? st.code() : absl::StatusCode::kInvalidArgument,
                        absl::StrCat(field, ": ", st.message()));
  };
  if (IsJsonl(tf)) {
    if (tf.tokenizer_dir.empty()) tf.tokenizer_dir = spec.hf_dir;
    if (tf.tokenizer_dir.empty()) {
      return bad(absl::StrCat("a JSONL dataset needs a tokenizer: set ", field, ".tokenizer_dir or model.hf_dir"));
    }
    auto tok = LoadTokenizerDir(tf.tokenizer_dir, tf.eos_token);
    if (!tok.ok()) return failed(tok.status());
    if (tok->tokenizer.IdLimit() > job->model.vocab) {
      return bad(absl::StrCat("the tokenizer in '", tf.tokenizer_dir, "' has ids up to ", tok->tokenizer.IdLimit() - 1,
                              " but the model's vocabulary is ", job->model.vocab));
    }
    uint64_t bytes = 0;
    auto fd = files::OpenForRead(tf.path, &bytes);
    if (!fd.ok()) return failed(fd.status());
  } else if (IsTokenDatasetFile(tf)) {
    // The header now (tensors, shapes); the tokens when the job starts (BuildJob).
    if (absl::Status st = CheckTokenDatasetFile(tf.path); !st.ok()) return bad(st.message());
  } else {
    if (tf.packing == TokenFileSource::Packing::kDocumentMasked) {
      return bad(absl::StrCat("packing: document masks need a dataset that knows its documents (JSONL or a token ",
                              "dataset file); '", tf.path, "' is a flat token file"));
    }
    auto ds = TokenDataset::Open(tf.path, tf.format, tf.global_batch, tf.sequence_length);
    if (!ds.ok()) return bad(ds.status().message());
    if (tf.shuffle) (*ds)->Shuffle(tf.shuffle_seed);
    if (absl::Status st = (*ds)->TakeShare(share.first, share.second); !st.ok()) return bad(st.message());
    *raw = std::move(*ds);
  }
  if (tf.global_batch % share.second != 0) {
    return bad(absl::StrCat("global_batch ", tf.global_batch, " cannot be split evenly over ", share.second,
                            " data-parallel nodes"));
  }
  const int64_t rows = tf.global_batch / share.second;
  if (rows % spec.microbatches != 0) {
    return bad(absl::StrCat(share.second > 1 ? "a node's share of the global batch, " : "global_batch ", rows,
                            share.second > 1 ? " sequences," : "", " cannot be split into ", spec.microbatches,
                            " micro-batches"));
  }
  if (tf.max_epochs < 1) return bad("max_epochs must be >= 1");
  return absl::OkStatus();
}

// A JSONL or token dataset source read whole (the runner, when the job starts); null for a raw
// token file (opened at Submit).
absl::StatusOr<std::unique_ptr<TokenDataset>> LoadPackedSource(const TokenFileSource& tf, const std::string& field,
                                                               const std::function<void(std::string)>& progress,
                                                               const std::atomic<bool>* stop) {
  if (!IsJsonl(tf) && !IsTokenDatasetFile(tf)) return std::unique_ptr<TokenDataset>();
  absl::StatusOr<PackedTokens> packed;
  if (IsJsonl(tf)) {
    progress("tokenizing " + tf.path);
    auto tok = LoadTokenizerDir(tf.tokenizer_dir, tf.eos_token);
    if (!tok.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", tok.status().message()));
    JsonlLimits limits;
    limits.stop = stop;
    limits.progress = [&](int64_t done, int64_t records) {
      progress(absl::StrCat("tokenizing ", tf.path, ": ", done, " of ", records, " records"));
    };
    packed = ReadJsonlDocuments(tf.path, *tok, limits);
  } else {
    progress("reading " + tf.path);
    packed = ReadTokenDatasetFile(tf.path, stop);
  }
  if (!packed.ok()) return packed.status();
  std::vector<int64_t> starts = std::move(packed->document_starts);
  auto ds = TokenDataset::FromPacked(std::move(packed->tokens), std::move(packed->trained), tf.global_batch,
                                     tf.sequence_length, absl::StrCat("dataset '", tf.path, "'"));
  if (!ds.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", ds.status().message()));
  if (tf.shuffle) (*ds)->Shuffle(tf.shuffle_seed);
  if (tf.packing == TokenFileSource::Packing::kDocumentMasked) (*ds)->MaskDocuments(std::move(starts));
  return std::move(*ds);
}

}  // namespace

absl::StatusOr<int64_t> PredictHostStateBytes(const JobSpec& job) {
  bool mapped = false;
  if (job.model.lora.rank > 0 && !job.hf_dir.empty()) {
    if (absl::Status st = job.model.Validate(); !st.ok()) return st;
    auto stored = workers::io::HfBaseIsStoredAs(job.hf_dir, job.model, ToScalarType(job.precision));
    if (!stored.ok()) return stored.status();
    mapped = *stored;
  }
  return planning::HostStateBytes(job.model, HostStateOptionsFor(job, mapped));
}

absl::Status PrepareJob(const JobSpec& spec_in, const std::vector<workers::Device*>& devices, EngineJob* job) {
  // Validation only: the files a job names are checked (headers, checksums) but nothing is
  // allocated or loaded until the runner takes the job (BuildJob), so a queued job costs no host
  // memory and Submit returns at once.
  JobSpec spec = spec_in;
  if (absl::Status st = spec.model.Validate(); !st.ok()) return st;
  if (spec.max_queued_batches < 1) return absl::InvalidArgumentError("job: max_queued_batches must be >= 1");
  if (spec.max_steps < 0) return absl::InvalidArgumentError("job: max_steps must be >= 0");
  if (!(spec.share > 0 && spec.share <= 1000)) {  // NaN fails too
    return absl::InvalidArgumentError(absl::StrCat("job: share must be in (0, 1000] (got ", spec.share, ")"));
  }
  const int N = static_cast<int>(devices.size());
  if (spec.microbatches == 0) spec.microbatches = N;
  if (!spec.partition && !spec.auto_partition) {
    auto p = PlanFromParameterSizes(spec.model, N, spec.microbatches);
    if (!p.ok()) return p.status();
    spec.partition = *p;
  }
  job->model = spec.model;
  job->dtype = ToScalarType(spec.precision);
  if (!spec.hf_dir.empty()) {
    if (absl::Status st = workers::io::CheckHfWeights(spec.hf_dir, job->model); !st.ok()) return st;
  }
  auto predicted = PredictHostStateBytes(spec);
  if (!predicted.ok()) return predicted.status();
  job->predicted_host_state_bytes = *predicted;
  const bool host_devices =
      std::all_of(devices.begin(), devices.end(), [](workers::Device* d) { return d->torch_device().is_cpu(); });
  if (host_devices && !devices.empty()) {
    job->predicted_worker_bytes = planning::CpuWorkingSetBytes(spec.model, HostStateOptionsFor(spec, false));
  }
  if (!spec.lora_adapter_dir.empty()) {
    if (job->model.lora.rank <= 0) return absl::InvalidArgumentError("job: an adapter dir needs a LoRA model");
    if (absl::Status st = workers::io::CheckPeftAdapter(spec.lora_adapter_dir, job->model); !st.ok()) return st;
  }
  if (!spec.resume_from.empty()) {
    auto meta = workers::io::VerifyCheckpoint(spec.resume_from);
    if (!meta.ok()) return meta.status();
    if (meta->optimizer != spec::OptimizerName(spec.optimizer.algorithm)) {
      return absl::InvalidArgumentError(absl::StrCat("resume_from: checkpoint ", spec.resume_from, " holds ",
                                                     meta->optimizer, " state; this job's optimizer is ",
                                                     spec::OptimizerName(spec.optimizer.algorithm)));
    }
    job->first_step = meta->step;
    job->consumed_offset = meta->batches_consumed;
    if (meta->eval) {  // the evaluations so far continue (best loss, early-stopping count, kept best)
      const files::CheckpointMeta::Eval& ev = *meta->eval;
      base::MutexLock lock(&job->mu);
      job->last_eval = EvalStats{ev.step,
                                 ev.loss,
                                 ev.tokens,
                                 0,
                                 ev.best_loss,
                                 ev.best_step,
                                 ev.step == ev.best_step,
                                 ev.step == ev.best_step ? ev.best_checkpoint : ""};
      job->evals_without_improvement = ev.without_improvement;
      job->best_checkpoint = ev.best_checkpoint;
      job->resumed_after_its_evaluation = ev.step == meta->step;
    }
    if (meta->fused > 0) {
      spec.partition = planning::Partition{meta->forward, meta->fused, meta->backward};
      spec.auto_partition = false;
      // The checkpoint's partition was planned with these already; nothing is planned again.
      spec.partition_min_stages = 0;
      spec.partition_t_max_window = 0;
      // The round size chosen with it is not in the checkpoint: all micro-batches in one round.
      if (spec.microbatches_per_round < 0) spec.microbatches_per_round = 0;
    }
  }
  if (spec.token_file) {
    if (absl::Status st =
            PrepareSource(*spec.token_file, spec, job, "data.token_file", &job->data, TrainingShare(spec));
        !st.ok()) {
      return st;
    }
  }
  if (spec.validation) {
    TokenFileSource& v = *spec.validation;
    if (v.global_batch == 0 && spec.token_file) v.global_batch = spec.token_file->global_batch;
    if (v.sequence_length == 0 && spec.token_file) v.sequence_length = spec.token_file->sequence_length;
    if (v.global_batch < 1 || v.sequence_length < 1) {
      return absl::InvalidArgumentError("data.validation: needs a global_batch and a sequence_length");
    }
    v.shuffle = false;  // one pass in file order per evaluation
    v.max_epochs = 1;
    if (absl::Status st = PrepareSource(v, spec, job, "data.validation", &job->validation); !st.ok()) return st;
  }
  if (spec.eval.every_steps < 0 || spec.eval.early_stopping_patience < 0) {
    return absl::InvalidArgumentError("eval: every_steps and early_stopping_patience must not be negative");
  }
  if (!spec.validation &&
      (spec.eval.every_steps > 0 || spec.eval.early_stopping_patience > 0 || spec.eval.keep_best_checkpoint)) {
    return absl::InvalidArgumentError("eval: evaluation needs a validation source (data.validation)");
  }
  if (spec.eval.keep_best_checkpoint && spec.checkpoint_root.empty()) {
    return absl::InvalidArgumentError("eval.keep_best_checkpoint: the job has no checkpoint directory");
  }
  if (absl::Status st = CheckSamples(spec.eval.samples, spec.validation.has_value() || job->generation_only);
      !st.ok()) {
    return st;
  }
  if (!spec.eval.samples.prompts.empty() && !job->generation_only) {  // a generation's is set already
    auto dir = SampleTokenizerDir(spec);
    if (!dir.ok()) return dir.status();
    job->sample_tokenizer_dir = *dir;
  }
  if (absl::Status st = CheckDataParallel(spec); !st.ok()) return st;
  ControllerOptions& o = job->controller_options;
  if (spec.partition) o.partition = *spec.partition;
  o.microbatches = spec.microbatches;
  o.microbatches_per_round = std::max(0, spec.microbatches_per_round);
  o.choose_round_size = spec.microbatches_per_round == -1;
  o.adamw = ToAdamW(spec.optimizer);
  o.adamw.rounding_seed = spec.seed;  // bf16 moments: the stochastic rounding's stream
  o.lr_schedule = spec.lr_schedule;
  o.loss_scaler.enabled = spec.precision == Precision::kFloat16;
  o.mode = spec.optimizer_mode;
  o.auto_partition = spec.auto_partition;
  o.stage_memory_cap = spec.stage_memory_cap > 0 ? spec.stage_memory_cap : DefaultStageMemoryCap(devices);
  o.min_stages = spec.partition_min_stages;
  o.t_max_window = spec.partition_t_max_window;
  if (absl::Status st = Controller::ValidateOptions(o, job->model, N); !st.ok()) return st;
  job->spec = spec;
  return absl::OkStatus();
}

absl::Status BuildJob(EngineJob& job, const std::vector<workers::Device*>& devices, workers::Timeline* timeline) {
  const JobSpec& spec = job.spec;
  auto progress = [&job](std::string what) {
    base::MutexLock lock(&job.mu);
    job.message = what;
    job.Emit({JobEvent::Kind::kProgress, job.state, {}, std::move(what)});
  };
  if (!spec.eval.samples.prompts.empty()) {  // the tokenizer of the sample generations, for the job's life
    if (!job.sample_tokenizer_dir.empty()) {
      auto tok = LoadTokenizerDir(job.sample_tokenizer_dir, "");
      if (!tok.ok()) return absl::InvalidArgumentError(absl::StrCat("eval.samples: ", tok.status().message()));
      job.sample_tokenizer = std::make_shared<const workers::text::Tokenizer>(std::move(tok->tokenizer));
    }
  }
  progress("allocating the host model store");
  std::shared_ptr<workers::HostModelStore> store;
  // A LoRA base from a model directory is mapped where it lies (no anonymous copy) when its
  // dtype is the job's: the store does not allocate or initialise it. The optimizer's state gets
  // its room in the store's layer slabs (one allocation per layer with the fp32 copies).
  const bool mapped_base = job.model.lora.rank > 0 && !spec.hf_dir.empty();
  try {
    store = std::make_shared<workers::HostModelStore>(
        job.model, job.dtype, spec.seed, 0.02,
        mapped_base ? workers::FrozenInit::kDeferred : workers::FrozenInit::kRandom,
        // A sharded optimizer state (data parallel) is allocated for the owned parameters only.
        spec.data_parallel && spec.data_parallel->shard_optimizer_state
            ? workers::StateReserve{}
            : workers::StateBytesPerElement(job.controller_options.adamw));
  } catch (const std::exception& ex) {
    return absl::ResourceExhaustedError(absl::StrCat("host memory for the model store: ", ex.what()));
  }
  const bool cuda = devices.front()->torch_device().is_cuda();
  if (!spec.hf_dir.empty()) {
    progress("loading weights from " + spec.hf_dir);
    // On CUDA a mapped base's files are registered for DMA where they lie (no pinned copy).
    workers::io::MappingRegistrar registrar;
    if (cuda) {
      registrar = [d = devices.front()](void* base, int64_t bytes) { return d->RegisterHostMemory(base, bytes); };
    }
    // A long load says how far it is, every 5 s.
    auto last = std::chrono::steady_clock::now();
    const workers::io::LoadProgress loaded = [&](int done, int params) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last < std::chrono::seconds(5)) return;
      last = now;
      progress(absl::StrCat("loading weights from ", spec.hf_dir, ": ", done, " of ", params, " tensors"));
    };
    if (absl::Status st = workers::io::LoadHfWeights(spec.hf_dir, store.get(), registrar, &job.stop_starting, loaded);
        !st.ok()) {
      return st;
    }
    if (const int64_t mapped = store->MappedBytes(); cuda && mapped > 0) {
      progress(absl::StrCat("registered ", store->RegisteredBytes() >> 20, " of ", mapped >> 20,
                            " MiB of mapped base weights for DMA (the rest is copied to pinned memory)"));
    }
  }
  if (cuda) {
    // Masters in pinned memory: weight uploads become asynchronous DMA (paper §4.2). Registered
    // mapped masters stay where they lie; masters whose registration was refused are copied.
    try {
      store->RelocateMasters(
          [d = devices.front()](at::IntArrayRef sizes, at::ScalarType dt) { return d->EmptyHost(sizes, dt); });
    } catch (const std::exception& ex) {
      return absl::ResourceExhaustedError(absl::StrCat("pinned host memory for the masters: ", ex.what()));
    }
  }
  if (!spec.lora_adapter_dir.empty()) {
    progress("loading the LoRA adapter from " + spec.lora_adapter_dir);
    if (absl::Status st = workers::io::LoadPeftAdapter(spec.lora_adapter_dir, store.get()); !st.ok()) return st;
    auto named = files::ReadPeftBaseModel(spec.lora_adapter_dir);
    if (named.ok() && !files::SameBaseModel(*named, spec.hf_dir)) {
      progress(absl::StrCat("warning: the adapter's adapter_config.json names the base model '", *named,
                            "', this job's base is '", spec.hf_dir,
                            "' (model.hf_dir); their shapes, rank, alpha and targets agree: check that the adapter "
                            "was trained on this base"));
    }
  }
  ControllerOptions o = job.controller_options;
  if (!spec.resume_from.empty()) {
    progress("loading checkpoint " + spec.resume_from);
    workers::AdamWState adamw;
    workers::io::FrozenBase base;
    auto meta = workers::io::ReadCheckpoint(spec.resume_from, store.get(), &adamw, &base);
    if (!meta.ok()) return meta.status();
    job.frozen_base = std::move(base);  // described to check it: kept for this job's checkpoints
    o.first_step = meta->step;
    o.resume_adamw = adamw;
    o.resume_loss_scale = meta->loss_scale;
    o.resume_good_steps = meta->good_steps;
  }
  std::unique_ptr<TokenDataset> data, validation;
  if (spec.token_file) {
    auto ds = LoadPackedSource(*spec.token_file, "data.token_file", progress, &job.stop_starting);
    if (!ds.ok()) return ds.status();
    data = std::move(*ds);
    const auto [rank, size] = TrainingShare(spec);
    if (data) {
      if (absl::Status st = data->TakeShare(rank, size); !st.ok()) return absl::InvalidArgumentError(st.message());
    }
  }
  if (spec.validation) {
    auto ds = LoadPackedSource(*spec.validation, "data.validation", progress, &job.stop_starting);
    if (!ds.ok()) return ds.status();
    validation = std::move(*ds);
  }
  if (spec.data_parallel) {
    progress(absl::StrCat("connecting to the data-parallel group '", spec.data_parallel->group, "' as node ",
                          spec.data_parallel->rank, " of ", spec.data_parallel->size));
    auto group =
        StartDataParallel(*spec.data_parallel, job.comm_binary, job.rendezvous_store.get(), &job.stop_starting, *store);
    if (!group.ok()) return group.status();
    o.data_parallel = std::move(*group);
    // A resumed checkpoint holds the whole state: this node keeps the part it owns.
    if (o.data_parallel->sharded() && o.resume_adamw) workers::KeepOwnedState(*o.data_parallel, &*o.resume_adamw);
  }
  o.timeline_job = static_cast<int>(job.id);  // the runner gives the job lanes tagged with its id
  auto c = Controller::Create(o, store.get(), devices, timeline);
  if (!c.ok()) return c.status();
  base::MutexLock lock(&job.mu);
  if (data) job.data = std::move(data);
  if (validation) job.validation = std::move(validation);
  job.store = std::move(store);
  job.controller = std::move(*c);
  return absl::OkStatus();
}

}  // namespace rp::scheduler::runtime
