#include "workers/io/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "workers/base/json_depth.h"
#include "workers/io/atomic_dir.h"
#include "workers/io/confined_fs.h"
#include "workers/io/safetensors_reader.h"
#include "workers/io/safetensors_writer.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {

namespace fs = std::filesystem;

namespace {

absl::StatusOr<uint32_t> FileCrc(const fs::path& p) {
  auto fd = OpenForRead(p.string(), nullptr);
  if (!fd.ok()) return absl::DataLossError(absl::StrCat("checkpoint: ", fd.status().message()));
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<unsigned char> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(fd->get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat("checkpoint: read ", p.string(), ": ", std::strerror(errno)));
    if (n == 0) break;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(crc);
}

// meta.json: a regular file of at most 1 MiB, parsed without exceptions.
absl::StatusOr<nlohmann::json> ReadMetaJson(const fs::path& dir) {
  auto text = ReadSmallFile((dir / "meta.json").string(), uint64_t{1} << 20);
  if (!text.ok())
    return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": meta.json: ", text.status().message()));
  if (std::string deep = base::JsonDepthError(*text); !deep.empty()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": meta.json: ", deep));
  }
  return nlohmann::json::parse(*text, nullptr, false);
}

// Typed access to meta.json fields that never throws: a field of the wrong type is absent.
std::string StringField(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}
int64_t IntField(const nlohmann::json& j, const char* key, int64_t fallback) {
  return j.is_object() && j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : fallback;
}
double NumberField(const nlohmann::json& j, const char* key, double fallback) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}
// A partition entry: a layer count in [0, 1<<20] (anything else is damage).
bool LayerCount(const nlohmann::json& x, int* out) {
  if (!x.is_number_integer()) return false;
  const int64_t v = x.get<int64_t>();
  if (v < 0 || v > (int64_t{1} << 20)) return false;
  *out = static_cast<int>(v);
  return true;
}

// The files meta.json carries a checksum of: base.json only when something is frozen.
std::vector<const char*> CheckedFiles(bool has_base) {
  std::vector<const char*> files = {"weights.safetensors", "optimizer.safetensors"};
  if (has_base) files.push_back("base.json");
  return files;
}

bool KnownFormat(const nlohmann::json& j) {
  const std::string f = StringField(j, "format");
  return f == "roundpipe-checkpoint-1" || f == "roundpipe-checkpoint-2";
}
bool HasBase(const nlohmann::json& j) { return j.contains("base") && j["base"].is_object(); }

absl::StatusOr<CheckpointMeta> MetaFromJson(const nlohmann::json& j, const std::string& dir) {
  const auto& p = j.contains("partition") ? j["partition"] : nlohmann::json();
  if (!p.is_object() || !p.contains("forward") || !p["forward"].is_array() || !p.contains("fused") ||
      !p["fused"].is_number_integer() || !p.contains("backward") || !p["backward"].is_array()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": meta.json has no partition"));
  }
  CheckpointMeta m;
  m.step = IntField(j, "step", -1);
  m.batches_consumed = IntField(j, "batches_consumed", -1);
  m.loss_scale = NumberField(j, "loss_scale", 1.0);
  m.good_steps = IntField(j, "good_steps", 0);
  if (m.step < 0 || m.batches_consumed < 0) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": meta.json has no valid step / batches_consumed"));
  }
  int fused = 0;
  if (!LayerCount(p["fused"], &fused)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": meta.json has a bad partition"));
  }
  m.fused = fused;
  for (const char* side : {"forward", "backward"}) {
    for (const auto& x : p[side]) {
      int v = 0;
      if (!LayerCount(x, &v)) {
        return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": meta.json has a bad partition"));
      }
      (std::string(side) == "forward" ? m.forward : m.backward).push_back(v);
    }
  }
  m.note = StringField(j, "note");
  m.optimizer = StringField(j, "optimizer");
  if (m.optimizer.empty()) m.optimizer = "adamw";  // written before SGD and Lion existed
  if (HasBase(j)) m.base_fingerprint = StringField(j["base"], "fingerprint");
  if (j.contains("eval")) {
    const auto& e = j["eval"];
    CheckpointMeta::Eval ev;
    ev.step = IntField(e, "step", -1);
    ev.loss = NumberField(e, "loss", 0);
    ev.tokens = IntField(e, "tokens", -1);
    ev.best_loss = NumberField(e, "best_loss", 0);
    ev.best_step = IntField(e, "best_step", -1);
    ev.without_improvement = static_cast<int>(IntField(e, "without_improvement", -1));
    ev.best_checkpoint = StringField(e, "best_checkpoint");
    if (!e.is_object() || ev.step < 0 || ev.tokens < 0 || ev.best_step < 0 || ev.without_improvement < 0) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": meta.json has a bad eval record"));
    }
    m.eval = ev;
  }
  return m;
}

}  // namespace

absl::Status WriteCheckpoint(const std::string& dir_in, const HostModelStore& store, const AdamWState& adamw,
                             const CheckpointMeta& meta, const FrozenBase* base_in) {
  auto out = AtomicDir::Begin(fs::absolute(dir_in).string());
  if (!out.ok()) return absl::Status(out.status().code(), absl::StrCat("checkpoint: ", out.status().message()));
  auto fail = [](absl::Status st) { return absl::Status(st.code(), absl::StrCat("checkpoint: ", st.message())); };
  // Weights: the fp32 copy of every trained parameter (its master copy is its rounding); the
  // frozen ones are described in base.json instead.
  std::vector<TensorDecl> wdecl, odecl;
  std::vector<at::Tensor> wt, ot;
  bool frozen = false;
  for (int i = 0; i < store.num_params(); ++i) {
    const HostParam& p = store.param(i);
    if (!p.trainable) {
      frozen = true;
      continue;
    }
    at::Tensor w = p.fp32.defined() ? p.fp32 : p.master.to(at::kFloat);
    wdecl.push_back({p.name, at::kFloat, p.shape});
    wt.push_back(w);
    const size_t k = static_cast<size_t>(i);
    // Optimizer state in its own dtype (fp32, or bf16 for bf16-moment jobs), read back as fp32:
    // AdamW's two moments, SGD's momentum buffer or Lion's exp_avg alone ("m."), or nothing yet.
    for (auto [prefix, state] : {std::pair{"m.", &adamw.m}, std::pair{"v.", &adamw.v}}) {
      if (k < state->size() && (*state)[k].defined()) {
        // The state's own shape: the parameter's, or Adafactor's factored row/column vectors.
        odecl.push_back({prefix + p.name, (*state)[k].scalar_type(), (*state)[k].sizes().vec()});
        ot.push_back((*state)[k]);
      }
    }
  }
  for (auto [file, decls, tensors] :
       {std::tuple{"weights.safetensors", &wdecl, &wt}, std::tuple{"optimizer.safetensors", &odecl, &ot}}) {
    SafetensorsWriter w;
    if (absl::Status st = w.Open(out->PathOf(file), *decls); !st.ok()) return fail(st);
    for (const at::Tensor& t : *tensors) {
      if (absl::Status st = w.Add(t); !st.ok()) return fail(st);
    }
    if (absl::Status st = w.Finish(); !st.ok()) return fail(st);
  }
  nlohmann::json j = {{"format", "roundpipe-checkpoint-2"},
                      {"step", meta.step},
                      {"adamw_step", adamw.step},
                      {"batches_consumed", meta.batches_consumed},
                      {"loss_scale", meta.loss_scale},
                      {"good_steps", meta.good_steps},
                      {"partition", {{"forward", meta.forward}, {"fused", meta.fused}, {"backward", meta.backward}}},
                      {"note", meta.note},
                      {"optimizer", meta.optimizer}};
  if (meta.eval) {
    const CheckpointMeta::Eval& e = *meta.eval;
    j["eval"] = {{"step", e.step},
                 {"loss", e.loss},
                 {"tokens", e.tokens},
                 {"best_loss", e.best_loss},
                 {"best_step", e.best_step},
                 {"without_improvement", e.without_improvement},
                 {"best_checkpoint", e.best_checkpoint}};
  }
  if (frozen) {
    const FrozenBase base = base_in ? *base_in : DescribeFrozenBase(store);
    if (absl::Status st = out->WriteFile("base.json", FrozenBaseJson(base)); !st.ok()) return fail(st);
    j["base"] = {{"fingerprint", base.fingerprint},
                 {"tensors", base.tensors.size()},
                 {"bytes", base.bytes},
                 {"file", "base.json"}};
  }
  for (const char* file : CheckedFiles(frozen)) {
    auto crc = FileCrc(out->PathOf(file));
    if (!crc.ok()) return fail(crc.status());
    j["crc32"][file] = *crc;
  }
  if (absl::Status st = out->WriteFile("meta.json", j.dump(2) + "\n"); !st.ok()) return fail(st);
  if (absl::Status st = out->Commit(); !st.ok()) return fail(st);
  return absl::OkStatus();
}

namespace {

// meta.json of a complete checkpoint whose files pass their checksums.
absl::StatusOr<nlohmann::json> VerifiedMetaJson(const fs::path& dir) {
  auto parsed = ReadMetaJson(dir);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (j.is_discarded() || !j.is_object() || !KnownFormat(j) || !j.contains("crc32")) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": meta.json is damaged"));
  }
  for (const char* file : CheckedFiles(HasBase(j))) {
    auto crc = FileCrc(dir / file);
    if (!crc.ok()) return crc.status();
    if (!j["crc32"].is_object() || !j["crc32"].contains(file) || !j["crc32"][file].is_number_unsigned() ||
        j["crc32"][file].get<uint64_t>() != *crc) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", file, " fails its checksum"));
    }
  }
  return parsed;
}

}  // namespace

absl::StatusOr<CheckpointMeta> VerifyCheckpoint(const std::string& dir) {
  auto j = VerifiedMetaJson(dir);
  if (!j.ok()) return j.status();
  return MetaFromJson(*j, dir);
}

namespace {

absl::StatusOr<FrozenBase> BaseOf(const fs::path& dir, const nlohmann::json& j) {
  if (!HasBase(j)) return FrozenBase{};
  auto text = ReadSmallFile((dir / "base.json").string(), uint64_t{256} << 20);
  if (!text.ok()) return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", text.status().message()));
  auto base = ParseFrozenBaseJson(*text);
  if (!base.ok()) return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", base.status().message()));
  return base;
}

}  // namespace

absl::StatusOr<CheckpointMeta> ReadCheckpoint(const std::string& dir_in, HostModelStore* store, AdamWState* adamw,
                                              FrozenBase* base_out) {
  const fs::path dir(dir_in);
  auto parsed = VerifiedMetaJson(dir);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  auto recorded = BaseOf(dir, j);
  if (!recorded.ok()) return recorded.status();
  FrozenBase actual;
  if (!recorded->empty() || base_out) actual = DescribeFrozenBase(*store);
  if (!recorded->empty()) {
    // Before anything is loaded: a wrong base fails the resume with the store as it was.
    if (absl::Status st = SameFrozenBase(*recorded, actual, absl::StrCat("checkpoint ", dir.string())); !st.ok())
      return st;
  }
  auto weights = SafetensorsFile::Open((dir / "weights.safetensors").string());
  if (!weights.ok()) return absl::DataLossError(std::string(weights.status().message()));
  auto opt = SafetensorsFile::Open((dir / "optimizer.safetensors").string());
  if (!opt.ok()) return absl::DataLossError(std::string(opt.status().message()));
  AdamWState st;
  st.step = IntField(j, "adamw_step", 0);
  const bool factored = StringField(j, "optimizer") == "adafactor";
  st.m.resize(static_cast<size_t>(store->num_params()));
  st.v.resize(static_cast<size_t>(store->num_params()));
  bool reloaded_base = false;
  for (int i = 0; i < store->num_params(); ++i) {
    HostParam& p = store->param(i);
    const TensorInfo* info = (*weights)->Find(p.name);
    if (!info && !p.trainable && recorded->Find(p.name)) continue;  // the base, checked above
    if (!info || info->shape != p.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", dir.string(), " does not fit this model: ", p.name));
    }
    at::Tensor w = *(*weights)->Read(p.name, at::kFloat);
    if (absl::Status set = store->SetValue(p.name, w); !set.ok()) return set;
    reloaded_base = reloaded_base || !p.trainable;  // format 1 stored the base too
    for (auto [prefix, state] : {std::pair{"m.", &st.m}, std::pair{"v.", &st.v}}) {
      const TensorInfo* t = (*opt)->Find(prefix + p.name);
      if (!t) continue;
      const std::optional<std::vector<int64_t>> want =
          factored ? AdafactorStateShape(prefix[0], p.shape) : std::optional<std::vector<int64_t>>(p.shape);
      if (!want || t->shape != *want) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", dir.string(), ": ", prefix, p.name, " has the wrong shape"));
      }
      auto value = (*opt)->Read(prefix + p.name, at::kFloat);
      if (!value.ok()) return absl::DataLossError(std::string(value.status().message()));
      (*state)[static_cast<size_t>(i)] = std::move(*value);
    }
  }
  *adamw = std::move(st);
  if (base_out) *base_out = reloaded_base ? DescribeFrozenBase(*store) : std::move(actual);
  return MetaFromJson(j, dir.string());
}

absl::StatusOr<FrozenBase> ReadCheckpointBase(const std::string& dir) {
  auto parsed = VerifiedMetaJson(dir);
  if (!parsed.ok()) return parsed.status();
  return BaseOf(dir, *parsed);
}

absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir) {
  auto parsed = ReadMetaJson(dir);
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (j.is_discarded() || !j.is_object() || !KnownFormat(j)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": meta.json is damaged"));
  }
  return MetaFromJson(j, dir);
}

std::vector<std::string> ListCheckpoints(const std::string& parent) {
  std::vector<std::pair<int64_t, std::string>> found;
  auto names = ListDir(parent);
  if (!names.ok()) return {};
  for (const std::string& name : *names) {
    int64_t step = 0;
    if (name.rfind("step-", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &step) || step < 0) continue;
    const std::string dir = (fs::path(parent) / name).string();
    // A real directory (a symlink planted in the checkpoint root is not a checkpoint) with a meta.json.
    if (KindOf(dir) != FileKind::kDirectory || KindOf(dir + "/meta.json") != FileKind::kFile) continue;
    found.emplace_back(step, dir);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

}  // namespace rp::workers::io
