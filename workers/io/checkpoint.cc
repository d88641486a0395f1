#include "workers/io/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "workers/io/safetensors_reader.h"
#include "workers/io/safetensors_writer.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {

namespace fs = std::filesystem;

namespace {

absl::StatusOr<uint32_t> FileCrc(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return absl::DataLossError(absl::StrCat("checkpoint: missing ", p.string()));
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
  }
  return static_cast<uint32_t>(crc);
}

void SyncPath(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
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
  return m;
}

}  // namespace

absl::Status WriteCheckpoint(const std::string& dir_in, const HostModelStore& store, const AdamWState& adamw,
                             const CheckpointMeta& meta) {
  const fs::path dir = fs::path(dir_in).lexically_normal();
  std::error_code ec;
  if (fs::exists(dir, ec)) return absl::AlreadyExistsError(absl::StrCat("checkpoint: ", dir.string(), " exists"));
  const fs::path parent = dir.parent_path();
  fs::create_directories(parent, ec);
  const fs::path tmp = parent / absl::StrFormat(".%s.tmp-%08x", dir.filename().string(), std::random_device{}());
  fs::create_directory(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("checkpoint: cannot create ", tmp.string(), ": ", ec.message()));
  auto fail = [&](absl::Status st) {
    fs::remove_all(tmp, ec);
    return st;
  };
  // Weights: the fp32 copy of every parameter (the master copy is its rounding).
  std::vector<TensorDecl> wdecl, odecl;
  std::vector<at::Tensor> wt, ot;
  for (int i = 0; i < store.num_params(); ++i) {
    const HostParam& p = store.param(i);
    at::Tensor w = p.fp32.defined() ? p.fp32 : p.master.to(at::kFloat);
    wdecl.push_back({p.name, at::kFloat, p.shape});
    wt.push_back(w);
    const size_t k = static_cast<size_t>(i);
    if (k < adamw.m.size() && adamw.m[k].defined()) {
      odecl.push_back({"m." + p.name, at::kFloat, p.shape});
      ot.push_back(adamw.m[k]);
      odecl.push_back({"v." + p.name, at::kFloat, p.shape});
      ot.push_back(adamw.v[k]);
    }
  }
  for (auto [file, decls, tensors] :
       {std::tuple{"weights.safetensors", &wdecl, &wt}, std::tuple{"optimizer.safetensors", &odecl, &ot}}) {
    SafetensorsWriter w;
    if (absl::Status st = w.Open((tmp / file).string(), *decls); !st.ok()) return fail(st);
    for (const at::Tensor& t : *tensors) {
      if (absl::Status st = w.Add(t); !st.ok()) return fail(st);
    }
    if (absl::Status st = w.Finish(); !st.ok()) return fail(st);
  }
  nlohmann::json j = {{"format", "roundpipe-checkpoint-1"},
                      {"step", meta.step},
                      {"adamw_step", adamw.step},
                      {"batches_consumed", meta.batches_consumed},
                      {"loss_scale", meta.loss_scale},
                      {"good_steps", meta.good_steps},
                      {"partition", {{"forward", meta.forward}, {"fused", meta.fused}, {"backward", meta.backward}}},
                      {"note", meta.note}};
  for (const char* file : {"weights.safetensors", "optimizer.safetensors"}) {
    auto crc = FileCrc(tmp / file);
    if (!crc.ok()) return fail(crc.status());
    j["crc32"][file] = *crc;
  }
  {
    std::ofstream out(tmp / "meta.json");
    out << j.dump(2) << "\n";
    if (!out) return fail(absl::InternalError("checkpoint: cannot write meta.json"));
  }
  SyncPath(tmp / "meta.json", false);
  SyncPath(tmp, true);
  fs::rename(tmp, dir, ec);
  if (ec) return fail(absl::InternalError(absl::StrCat("checkpoint: rename: ", ec.message())));
  SyncPath(parent, true);
  return absl::OkStatus();
}

absl::StatusOr<CheckpointMeta> ReadCheckpoint(const std::string& dir_in, HostModelStore* store, AdamWState* adamw) {
  const fs::path dir(dir_in);
  std::ifstream in(dir / "meta.json");
  if (!in) return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": no meta.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || StringField(j, "format") != "roundpipe-checkpoint-1" ||
      !j.contains("crc32")) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": meta.json is damaged"));
  }
  for (const char* file : {"weights.safetensors", "optimizer.safetensors"}) {
    auto crc = FileCrc(dir / file);
    if (!crc.ok()) return crc.status();
    if (!j["crc32"].is_object() || !j["crc32"].contains(file) || !j["crc32"][file].is_number_unsigned() ||
        j["crc32"][file].get<uint64_t>() != *crc) {
      return absl::DataLossError(absl::StrCat("checkpoint ", dir.string(), ": ", file, " fails its checksum"));
    }
  }
  auto weights = SafetensorsFile::Open((dir / "weights.safetensors").string());
  if (!weights.ok()) return absl::DataLossError(std::string(weights.status().message()));
  auto opt = SafetensorsFile::Open((dir / "optimizer.safetensors").string());
  if (!opt.ok()) return absl::DataLossError(std::string(opt.status().message()));
  AdamWState st;
  st.step = IntField(j, "adamw_step", 0);
  st.m.resize(static_cast<size_t>(store->num_params()));
  st.v.resize(static_cast<size_t>(store->num_params()));
  for (int i = 0; i < store->num_params(); ++i) {
    HostParam& p = store->param(i);
    const TensorInfo* info = (*weights)->Find(p.name);
    if (!info || info->shape != p.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", dir.string(), " does not fit this model: ", p.name));
    }
    at::Tensor w = *(*weights)->Read(p.name, at::kFloat);
    if (p.fp32.defined()) p.fp32.copy_(w);
    p.master.copy_(w);
    if ((*opt)->Find("m." + p.name)) {
      st.m[static_cast<size_t>(i)] = *(*opt)->Read("m." + p.name, at::kFloat);
      st.v[static_cast<size_t>(i)] = *(*opt)->Read("v." + p.name, at::kFloat);
    }
  }
  *adamw = std::move(st);
  return MetaFromJson(j, dir.string());
}

absl::StatusOr<CheckpointMeta> ReadCheckpointMeta(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "meta.json");
  if (!in) return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": no meta.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || StringField(j, "format") != "roundpipe-checkpoint-1") {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": meta.json is damaged"));
  }
  return MetaFromJson(j, dir);
}

std::vector<std::string> ListCheckpoints(const std::string& parent) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !fs::exists(e.path() / "meta.json", ec)) continue;
    try {
      found.emplace_back(std::stoll(name.substr(5)), e.path().string());
    } catch (...) {
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

}  // namespace rp::workers::io
