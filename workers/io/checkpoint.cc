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
#include "workers/files/atomic_dir.h"
#include "workers/files/confined_fs.h"
#include "workers/io/safetensors_reader.h"
#include "workers/io/safetensors_writer.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {

namespace fs = std::filesystem;

namespace {

absl::StatusOr<uint32_t> FileCrc(const fs::path& p) {
  auto fd = files::OpenForRead(p.string(), nullptr);
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
absl::StatusOr<files::CheckpointMetaFile> ReadMetaFile(const fs::path& dir) {
  auto text = files::ReadSmallFile((dir / "meta.json").string(), uint64_t{1} << 20);
  if (!text.ok())
    return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": meta.json: ", text.status().message()));
  return files::ParseCheckpointMeta(*text, dir.string());
}

}  // namespace

absl::Status WriteCheckpoint(const std::string& dir_in, const HostModelStore& store, const AdamWState& adamw,
                             const files::CheckpointMeta& meta, const FrozenBase* base_in) {
  auto out = files::AtomicDir::Begin(fs::absolute(dir_in).string());
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
    const files::CheckpointMeta::Eval& e = *meta.eval;
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
  for (const char* file : files::CheckpointCheckedFiles(frozen)) {
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
absl::StatusOr<files::CheckpointMetaFile> VerifiedMetaFile(const fs::path& dir) {
  auto parsed = ReadMetaFile(dir);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->has_checksums) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": meta.json is damaged"));
  }
  for (const char* file : files::CheckpointCheckedFiles(parsed->has_base)) {
    auto crc = FileCrc(dir / file);
    if (!crc.ok()) return crc.status();
    auto recorded = parsed->crc32.find(file);
    if (recorded == parsed->crc32.end() || recorded->second != *crc) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", file, " fails its checksum"));
    }
  }
  return parsed;
}

}  // namespace

absl::StatusOr<files::CheckpointMeta> VerifyCheckpoint(const std::string& dir) {
  auto f = VerifiedMetaFile(dir);
  if (!f.ok()) return f.status();
  return f->meta;
}

namespace {

absl::StatusOr<FrozenBase> BaseOf(const fs::path& dir, const files::CheckpointMetaFile& meta) {
  if (!meta.has_base) return FrozenBase{};
  auto text = files::ReadSmallFile((dir / "base.json").string(), uint64_t{256} << 20);
  if (!text.ok()) return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", text.status().message()));
  auto base = ParseFrozenBaseJson(*text);
  if (!base.ok()) return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", base.status().message()));
  return base;
}

}  // namespace

absl::StatusOr<files::CheckpointMeta> ReadCheckpoint(const std::string& dir_in, HostModelStore* store,
                                                     AdamWState* adamw, FrozenBase* base_out) {
  const fs::path dir(dir_in);
  auto parsed = VerifiedMetaFile(dir);
  if (!parsed.ok()) return parsed.status();
  auto recorded = BaseOf(dir, *parsed);
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
  st.step = parsed->adamw_step;
  const bool factored = parsed->meta.optimizer == "adafactor";
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
  return parsed->meta;
}

absl::StatusOr<FrozenBase> ReadCheckpointBase(const std::string& dir) {
  auto parsed = VerifiedMetaFile(dir);
  if (!parsed.ok()) return parsed.status();
  return BaseOf(dir, *parsed);
}

absl::StatusOr<files::CheckpointMeta> ReadCheckpointMeta(const std::string& dir) {
  auto parsed = ReadMetaFile(dir);
  if (!parsed.ok()) return parsed.status();
  return parsed->meta;
}

std::vector<std::string> ListCheckpoints(const std::string& parent) {
  std::vector<std::pair<int64_t, std::string>> found;
  auto names = files::ListDir(parent);
  if (!names.ok()) return {};
  for (const std::string& name : *names) {
    int64_t step = 0;
    if (name.rfind("step-", 0) != 0 || !absl::SimpleAtoi(name.substr(5), &step) || step < 0) continue;
    const std::string dir = (fs::path(parent) / name).string();
    // A real directory (a symlink planted in the checkpoint root is not a checkpoint) with a meta.json.
    if (files::KindOf(dir) != files::FileKind::kDirectory ||
        files::KindOf(dir + "/meta.json") != files::FileKind::kFile)
      continue;
    found.emplace_back(step, dir);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

}  // namespace rp::workers::io
