#include "workers/io/hf_config.h"
#include "workers/io/hf_tensors.h"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "workers/files/bounded_json.h"
#include "workers/files/confined_fs.h"
#include "workers/files/hub_experts.h"
#include "workers/io/mxfp4.h"
#include "workers/io/safetensors_reader.h"
#include "workers/models/layers.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {

namespace fs = std::filesystem;

namespace {

// JSON files of a model or adapter directory: regular files beneath the roots, bounded.
absl::StatusOr<std::string> ReadText(const fs::path& p) { return files::ReadSmallFile(p.string(), uint64_t{64} << 20); }

}  // namespace

namespace {

// A model directory's weight files, opened (memory-mapped, headers parsed), and which file holds
// which tensor.
struct HfWeightFiles {
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> open;  // by file name (views share them)
  std::map<std::string, std::string> file_of;                          // tensor -> file name
};

absl::StatusOr<HfWeightFiles> OpenHfWeights(const std::string& dir) {
  HfWeightFiles w;
  std::vector<std::string> files;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const bool sharded = files::KindOf(index.string()) != files::FileKind::kMissing;
  if (sharded) {
    auto text = ReadText(index);
    if (!text.ok()) return text.status();
    auto parsed = files::ParseBoundedJson(*text, "model.safetensors.index.json");
    if (!parsed.ok()) return parsed.status();
    const nlohmann::json& j = *parsed;
    if (!files::MemberOrNull(j, "weight_map").is_object()) {
      return absl::InvalidArgumentError("model.safetensors.index.json: no weight_map object");
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return absl::InvalidArgumentError("weight_map: file names must be strings");
      const std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f == "..") {
        return absl::InvalidArgumentError(absl::StrCat("weight_map: shard '", f, "' must be a file in the model dir"));
      }
      w.file_of[it.key()] = f;
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
    }
  } else {
    files.push_back("model.safetensors");
  }
  for (const auto& f : files) {
    auto sf = SafetensorsFile::Open((fs::path(dir) / f).string());
    if (!sf.ok()) return sf.status();
    if (!sharded) {
      for (const auto& t : (*sf)->tensors()) w.file_of[t.name] = f;
    }
    w.open[f] = std::move(*sf);
  }
  return w;
}

// The tensor `name` of shape `shape` in the directory (NotFound / InvalidArgument saying why).
absl::StatusOr<std::shared_ptr<const SafetensorsFile>> Locate(const HfWeightFiles& w, const std::string& dir,
                                                              const std::string& name,
                                                              const std::vector<int64_t>& shape) {
  auto where = w.file_of.find(name);
  if (where == w.file_of.end()) return absl::NotFoundError(absl::StrCat("model dir '", dir, "' has no tensor ", name));
  const std::shared_ptr<const SafetensorsFile>& sf = w.open.at(where->second);
  const TensorInfo* info = sf->Find(name);
  if (!info) return absl::NotFoundError(absl::StrCat("'", sf->path(), "' has no tensor ", name));
  if (info->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(info->shape, ","),
                                                   "], config.json implies [", absl::StrJoin(shape, ","), "]"));
  }
  return sf;
}

// Where a store parameter is read from: the tensor itself; for a GPT-OSS block's stacked experts
// stored in MXFP4 (mxfp4.h), its `_blocks` and `_scales`; or, for a Qwen3-MoE block's stacked
// experts stored per expert (hub_experts.h), those pieces, expert by expert.
struct Piece {
  std::shared_ptr<const SafetensorsFile> file;
  std::string name;
};
struct ParamSource {
  std::shared_ptr<const SafetensorsFile> whole;  // set: the tensor itself
  std::vector<Piece> mxfp4;                      // else, when set: blocks and scales
  std::vector<std::vector<Piece>> per_expert;    // else: each expert's pieces in row order
};

// The MXFP4 pair of stacked tensor `name` [E, A, B] (x·W layout): blocks [E, B, A/32, 16] and
// scales [E, B, A/32] (transformers dequantises them to [E, B, A] and transposes the last two).
// NotFound when the directory has no `name`_blocks.
absl::StatusOr<std::vector<Piece>> LocateMxfp4(const HfWeightFiles& w, const std::string& dir, const std::string& name,
                                               const std::vector<int64_t>& shape) {
  if (shape.size() != 3 || w.file_of.count(name + "_blocks") == 0) {
    return absl::NotFoundError(absl::StrCat("model dir '", dir, "' has no tensor ", name, "_blocks"));
  }
  if (shape[1] % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, "_blocks: MXFP4 needs ", shape[1],
                                                   " (dimension 1 of ", name, ") to be a multiple of 32"));
  }
  const int64_t groups = shape[1] / 32;
  std::vector<Piece> out;
  for (const auto& [suffix, s] :
       {std::pair<std::string, std::vector<int64_t>>{"_blocks", {shape[0], shape[2], groups, 16}},
        {"_scales", {shape[0], shape[2], groups}}}) {
    auto f = Locate(w, dir, name + suffix, s);
    if (!f.ok()) return absl::InvalidArgumentError(f.status().message());  // half a pair: a broken directory
    if ((*f)->Find(name + suffix)->dtype != at::kByte) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, suffix, " must be U8 (MXFP4)"));
    }
    out.push_back({*f, name + suffix});
  }
  return out;
}

absl::StatusOr<ParamSource> LocateParam(const HfWeightFiles& w, const std::string& dir, const std::string& name,
                                        const std::vector<int64_t>& shape) {
  auto sf = Locate(w, dir, name, shape);
  if (sf.ok()) return ParamSource{*sf, {}, {}};
  if (sf.status().code() != absl::StatusCode::kNotFound) return sf.status();
  auto packed = LocateMxfp4(w, dir, name, shape);
  if (packed.ok()) return ParamSource{nullptr, *std::move(packed), {}};
  if (packed.status().code() != absl::StatusCode::kNotFound) return packed.status();
  const std::vector<files::HubExpertPiece> pieces = files::HubExpertPieces(name, shape);
  if (pieces.empty()) return sf.status();
  ParamSource src;
  src.per_expert.resize(static_cast<size_t>(shape[0]));
  for (const files::HubExpertPiece& p : pieces) {
    auto f = Locate(w, dir, p.name, p.shape);
    // A missing expert tensor is a broken model directory, as a misshapen one is.
    if (!f.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(f.status().message(), " (nor ", name, " stacked or in MXFP4)"));
    }
    src.per_expert[static_cast<size_t>(p.expert)].push_back({*f, p.name});
  }
  return src;
}

absl::StatusOr<at::Tensor> ReadParam(const ParamSource& src, const std::string& name) {
  if (src.whole) return src.whole->Read(name, at::kFloat);
  if (!src.mxfp4.empty()) {
    auto blocks = src.mxfp4[0].file->Read(src.mxfp4[0].name, at::kByte);
    if (!blocks.ok()) return blocks.status();
    auto scales = src.mxfp4[1].file->Read(src.mxfp4[1].name, at::kByte);
    if (!scales.ok()) return scales.status();
    auto t = DequantizeMxfp4(*blocks, *scales, at::kFloat);
    if (!t.ok()) return t.status();
    return t->transpose(1, 2).contiguous();
  }
  std::vector<at::Tensor> experts;
  for (const std::vector<Piece>& pieces : src.per_expert) {
    std::vector<at::Tensor> parts;
    for (const Piece& p : pieces) {
      auto t = p.file->Read(p.name, at::kFloat);
      if (!t.ok()) return t.status();
      parts.push_back(*std::move(t));
    }
    experts.push_back(at::cat(parts, 0));
  }
  return at::stack(experts, 0);
}

}  // namespace

absl::Status CheckHfWeights(const std::string& dir, const spec::ModelConfig& config) {
  auto w = OpenHfWeights(dir);
  if (!w.ok()) return w.status();
  for (const models::ParamSpec& p : models::ModelParams(config)) {
    if (p.lora != 0) continue;  // adapters: not in a base model
    if (auto sf = LocateParam(*w, dir, p.name, p.shape); !sf.ok()) return sf.status();
  }
  return absl::OkStatus();
}

namespace {

// A file mapping registered for DMA. Members are destroyed in reverse order: the registration
// is released before the last reference to the file can unmap it.
struct RegisteredMapping {
  std::shared_ptr<const SafetensorsFile> file;
  std::shared_ptr<void> registration;
};

// Registers each file once (null: refused, and not asked again).
class Registrations {
 public:
  explicit Registrations(const MappingRegistrar& registrar) : registrar_(registrar) {}
  // `view` (a tensor of `file`'s mapping) holding its file's registration; undefined when there
  // is no registrar or the registration was refused.
  at::Tensor Hold(const std::shared_ptr<const SafetensorsFile>& file, const at::Tensor& view) {
    if (!registrar_) return at::Tensor();
    auto [it, added] = done_.try_emplace(file.get());
    if (added) {
      auto handle = registrar_(file->mapping(), file->mapping_bytes());
      if (handle.ok()) it->second = std::make_shared<RegisteredMapping>(RegisteredMapping{file, *std::move(handle)});
    }
    if (!it->second) return at::Tensor();
    return at::from_blob(
        view.data_ptr(), view.sizes(), [keep = it->second](void*) mutable { keep.reset(); },
        at::TensorOptions().dtype(view.scalar_type()));
  }

 private:
  const MappingRegistrar& registrar_;
  std::map<const SafetensorsFile*, std::shared_ptr<RegisteredMapping>> done_;
};

}  // namespace

absl::Status LoadHfWeights(const std::string& dir, HostModelStore* store, const MappingRegistrar& registrar,
                           const std::atomic<bool>* stop, const LoadProgress& progress) {
  auto w = OpenHfWeights(dir);
  if (!w.ok()) return w.status();
  Registrations registrations(registrar);
  for (int i = 0; i < store->num_params(); ++i) {
    if (stop != nullptr && stop->load(std::memory_order_relaxed)) {
      return absl::CancelledError(absl::StrCat("loading weights from '", dir, "' was stopped"));
    }
    if (progress && i > 0) progress(i, store->num_params());
    HostParam& p = store->param(i);
    if (p.name.find(".lora_") != std::string::npos) continue;  // adapters: not in a base model
    auto src = LocateParam(*w, dir, p.name, p.shape);
    if (!src.ok()) return src.status();
    if (!p.trainable && src->whole && src->whole->Find(p.name)->dtype == store->master_dtype()) {
      // A frozen tensor already in the master dtype is used where it lies (no copy).
      auto view = SafetensorsFile::View(src->whole, p.name);
      if (view.ok()) {
        if (at::Tensor held = registrations.Hold(src->whole, *view); held.defined()) {
          if (store->AdoptMappedMaster(i, held, /*registered=*/true).ok()) continue;
        } else if (store->AdoptMappedMaster(i, *view).ok()) {
          continue;
        }
      }
    }
    auto t = ReadParam(*src, p.name);
    if (!t.ok()) return t.status();
    if (absl::Status st = store->SetValue(p.name, *t); !st.ok()) return st;
  }
  if (progress) progress(store->num_params(), store->num_params());
  return absl::OkStatus();
}

absl::StatusOr<bool> HfBaseIsStoredAs(const std::string& dir, const spec::ModelConfig& config, at::ScalarType dtype) {
  auto w = OpenHfWeights(dir);
  if (!w.ok()) return w.status();
  for (const models::ParamSpec& p : models::ModelParams(config)) {
    if (p.lora != 0) continue;
    auto src = LocateParam(*w, dir, p.name, p.shape);
    if (!src.ok()) return src.status();
    if (!src->whole || src->whole->Find(p.name)->dtype != dtype) return false;  // per-expert pieces are copied
  }
  return true;
}

absl::StatusOr<at::Tensor> ReadHfTensor(const std::string& dir, const std::string& name,
                                        const std::vector<int64_t>& shape) {
  auto w = OpenHfWeights(dir);
  if (!w.ok()) return w.status();
  auto src = LocateParam(*w, dir, name, shape);
  if (!src.ok()) return src.status();
  return ReadParam(*src, name);
}

absl::Status CheckPeftAdapter(const std::string& dir, const spec::ModelConfig& config) {
  // The adapter's own description first: an adapter of another rank, scale or set of targets
  // can have tensors of the right shapes and would load silently otherwise.
  auto peft = files::ReadPeftConfig(dir);
  if (!peft.ok())
    return absl::Status(peft.status().code(), absl::StrCat("adapter '", dir, "': ", peft.status().message()));
  if (peft->rank != config.lora.rank ||
      std::abs(peft->alpha - config.lora.alpha) > 1e-9 * std::abs(config.lora.alpha)) {
    return absl::InvalidArgumentError(absl::StrCat("adapter '", dir, "': adapter_config.json has r = ", peft->rank,
                                                   ", lora_alpha = ", peft->alpha, "; the job's model.lora has rank ",
                                                   config.lora.rank, ", alpha ", config.lora.alpha));
  }
  const std::set<std::string> theirs(peft->targets.begin(), peft->targets.end());
  const std::set<std::string> ours(config.lora.targets.begin(), config.lora.targets.end());
  if (theirs != ours) {
    return absl::InvalidArgumentError(absl::StrCat("adapter '", dir, "': adapter_config.json targets [",
                                                   absl::StrJoin(theirs, ", "), "]; the job's model.lora targets [",
                                                   absl::StrJoin(ours, ", "), "]"));
  }
  auto sf = SafetensorsFile::Open((fs::path(dir) / "adapter_model.safetensors").string());
  if (!sf.ok()) return sf.status();
  for (int l = 0; l < config.num_layers(); ++l) {
    for (const models::ParamSpec& p : models::LayerParams(config, l)) {
      if (p.lora == 0) continue;
      const std::string name = "base_model.model." + p.name;
      const TensorInfo* info = (*sf)->Find(name);
      if (!info) return absl::NotFoundError(absl::StrCat("adapter '", dir, "' has no tensor ", name));
      if (info->shape != p.shape)
        return absl::InvalidArgumentError(absl::StrCat("adapter tensor ", name, ": wrong shape"));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadPeftAdapter(const std::string& dir, HostModelStore* store) {
  auto sf = SafetensorsFile::Open((fs::path(dir) / "adapter_model.safetensors").string());
  if (!sf.ok()) return sf.status();
  for (int i = 0; i < store->num_params(); ++i) {
    HostParam& p = store->param(i);
    if (p.name.find(".lora_") == std::string::npos) continue;
    const std::string name = "base_model.model." + p.name;
    const TensorInfo* info = (*sf)->Find(name);
    if (!info) return absl::NotFoundError(absl::StrCat("adapter '", dir, "' has no tensor ", name));
    if (info->shape != p.shape)
      return absl::InvalidArgumentError(absl::StrCat("adapter tensor ", name, ": wrong shape"));
    auto t = (*sf)->Read(name, at::kFloat);
    if (!t.ok()) return t.status();
    if (p.fp32.defined()) p.fp32.copy_(*t);
    p.master.copy_(*t);
  }
  return absl::OkStatus();
}

}  // namespace rp::workers::io
