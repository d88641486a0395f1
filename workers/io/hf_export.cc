#include "workers/io/hf_export.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "workers/io/safetensors_writer.h"

namespace rp::workers::io {
namespace fs = std::filesystem;

std::string HfConfigJson(const models::TransformerConfig& c, at::ScalarType dtype) {
  const bool qwen = c.family == "qwen3";
  nlohmann::json j;
  j["architectures"] = {qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen ? "qwen3" : "llama";
  j["vocab_size"] = c.vocab;
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.intermediate;
  j["num_hidden_layers"] = c.num_blocks;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["max_position_embeddings"] = std::max<int64_t>(c.rope_scaling.original_max_position, 8192);
  j["torch_dtype"] = dtype == at::kFloat ? "float32" : dtype == at::kHalf ? "float16" : "bfloat16";
  if (c.rope_scaling.factor > 0) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j.dump(2);
}

namespace {

absl::Status WriteFileSynced(const fs::path& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return absl::InternalError(absl::StrCat("cannot create ", path.string()));
  const bool ok =
      std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

void SyncDirectory(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

absl::StatusOr<int64_t> ExportHfModel(const std::string& dir_in, const models::TransformerConfig& config,
                                      const std::vector<NamedShape>& tensors,
                                      const std::function<absl::StatusOr<at::Tensor>(const std::string&)>& fetch,
                                      const HfExportOptions& options) {
  const fs::path dir = fs::path(dir_in).lexically_normal();
  std::error_code ec;
  if (fs::exists(dir, ec)) return absl::AlreadyExistsError(absl::StrCat("export: ", dir.string(), " already exists"));
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  fs::create_directories(parent, ec);
  if (ec) return absl::InternalError(absl::StrCat("export: cannot create ", parent.string(), ": ", ec.message()));
  const fs::path tmp = parent / absl::StrFormat(".%s.tmp-%08x", dir.filename().string(), std::random_device{}());
  fs::create_directory(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("export: cannot create ", tmp.string(), ": ", ec.message()));
  auto cleanup = [&] { fs::remove_all(tmp, ec); };

  std::vector<TensorDecl> decls;
  for (const auto& [name, shape] : tensors) decls.push_back({name, options.dtype, shape});
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < decls.size(); ++i) {
    const int64_t b = NumBytes(decls[i]);
    if (in_shard > 0 && in_shard + b > options.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
  }
  int64_t total = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1
                                 ? std::string("model.safetensors")
                                 : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    std::vector<TensorDecl> part;
    for (size_t i : shards[s]) {
      part.push_back(decls[i]);
      weight_map[decls[i].name] = file;
      total += NumBytes(decls[i]);
    }
    SafetensorsWriter w;
    if (absl::Status st = w.Open((tmp / file).string(), part, {{"format", "pt"}}); !st.ok()) return cleanup(), st;
    for (const TensorDecl& d : part) {
      auto t = fetch(d.name);
      if (!t.ok()) return cleanup(), t.status();
      if (absl::Status st = w.Add(*t); !st.ok()) return cleanup(), st;
    }
    if (absl::Status st = w.Finish(); !st.ok()) return cleanup(), st;
  }
  if (shards.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    if (absl::Status st = WriteFileSynced(tmp / "model.safetensors.index.json", index.dump(2)); !st.ok()) {
      return cleanup(), st;
    }
  }
  if (absl::Status st = WriteFileSynced(tmp / "config.json", HfConfigJson(config, options.dtype)); !st.ok()) {
    return cleanup(), st;
  }
  SyncDirectory(tmp);
  fs::rename(tmp, dir, ec);
  if (ec) return cleanup(), absl::InternalError(absl::StrCat("export: rename to ", dir.string(), ": ", ec.message()));
  SyncDirectory(parent);
  return total;
}

}  // namespace rp::workers::io
