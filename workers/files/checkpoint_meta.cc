#include "workers/files/checkpoint_meta.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "workers/base/json_depth.h"

namespace rp::files {
namespace {

using Json = nlohmann::json;

// Typed access that never throws: a field of the wrong type is absent.
const Json* Member(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}
std::string StringField(const Json& j, const char* key) {
  const Json* v = Member(j, key);
  return v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
}
int64_t IntField(const Json& j, const char* key, int64_t fallback) {
  const Json* v = Member(j, key);
  if (v == nullptr || !v->is_number_integer()) return fallback;
  // An unsigned value above int64's range is damage, never a wrapped negative or a huge count.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return fallback;
  return v->get<int64_t>();
}
double NumberField(const Json& j, const char* key, double fallback) {
  const Json* v = Member(j, key);
  return v != nullptr && v->is_number() ? v->get<double>() : fallback;
}
// A partition entry: a layer count in [0, 1<<20] (anything else is damage).
bool LayerCount(const Json& x, int* out) {
  if (!x.is_number_integer()) return false;
  if (x.is_number_unsigned() && x.get<uint64_t>() > (uint64_t{1} << 20)) return false;
  const int64_t v = x.get<int64_t>();
  if (v < 0 || v > (int64_t{1} << 20)) return false;
  *out = static_cast<int>(v);
  return true;
}

absl::Status Damaged(const std::string& dir, const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": meta.json ", what));
}

absl::Status ReadPartition(const Json& j, const std::string& dir, CheckpointMeta* m) {
  const Json* p = Member(j, "partition");
  const Json* fused = p != nullptr ? Member(*p, "fused") : nullptr;
  const Json* fwd = p != nullptr ? Member(*p, "forward") : nullptr;
  const Json* bwd = p != nullptr ? Member(*p, "backward") : nullptr;
  if (fused == nullptr || fwd == nullptr || bwd == nullptr || !fwd->is_array() || !bwd->is_array() ||
      !fused->is_number_integer()) {
    return Damaged(dir, "has no partition");
  }
  if (!LayerCount(*fused, &m->fused)) return Damaged(dir, "has a bad partition");
  for (auto [side, out] : {std::pair{fwd, &m->forward}, std::pair{bwd, &m->backward}}) {
    for (const Json& x : *side) {
      int v = 0;
      if (!LayerCount(x, &v)) return Damaged(dir, "has a bad partition");
      out->push_back(v);
    }
  }
  return absl::OkStatus();
}

absl::Status ReadEval(const Json& e, const std::string& dir, CheckpointMeta* m) {
  CheckpointMeta::Eval ev;
  ev.step = IntField(e, "step", -1);
  ev.loss = NumberField(e, "loss", 0);
  ev.tokens = IntField(e, "tokens", -1);
  ev.best_loss = NumberField(e, "best_loss", 0);
  ev.best_step = IntField(e, "best_step", -1);
  const int64_t without = IntField(e, "without_improvement", -1);
  ev.best_checkpoint = StringField(e, "best_checkpoint");
  if (!e.is_object() || ev.step < 0 || ev.tokens < 0 || ev.best_step < 0 || without < 0 || without > INT32_MAX) {
    return Damaged(dir, "has a bad eval record");
  }
  ev.without_improvement = static_cast<int>(without);
  m->eval = ev;
  return absl::OkStatus();
}

}  // namespace

std::vector<const char*> CheckpointCheckedFiles(bool has_base) {
  std::vector<const char*> files = {"weights.safetensors", "optimizer.safetensors"};
  if (has_base) files.push_back("base.json");
  return files;
}

absl::StatusOr<CheckpointMetaFile> ParseCheckpointMeta(const std::string& text, const std::string& dir) {
  if (std::string deep = base::JsonDepthError(text); !deep.empty()) {
    return absl::DataLossError(absl::StrCat("checkpoint ", dir, ": meta.json: ", deep));
  }
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  const std::string format = StringField(j, "format");
  if (j.is_discarded() || !j.is_object() ||
      (format != "roundpipe-checkpoint-1" && format != "roundpipe-checkpoint-2")) {
    return Damaged(dir, "is damaged");
  }
  CheckpointMetaFile f;
  CheckpointMeta& m = f.meta;
  if (absl::Status st = ReadPartition(j, dir, &m); !st.ok()) return st;
  m.step = IntField(j, "step", -1);
  m.batches_consumed = IntField(j, "batches_consumed", -1);
  m.loss_scale = NumberField(j, "loss_scale", 1.0);
  m.good_steps = IntField(j, "good_steps", 0);
  if (m.step < 0 || m.batches_consumed < 0) return Damaged(dir, "has no valid step / batches_consumed");
  m.note = StringField(j, "note");
  m.optimizer = StringField(j, "optimizer");
  if (m.optimizer.empty()) m.optimizer = "adamw";  // written before SGD and Lion existed
  if (const Json* base = Member(j, "base"); base != nullptr && base->is_object()) {
    f.has_base = true;
    m.base_fingerprint = StringField(*base, "fingerprint");
  }
  if (const Json* e = Member(j, "eval"); e != nullptr) {
    if (absl::Status st = ReadEval(*e, dir, &m); !st.ok()) return st;
  }
  f.adamw_step = IntField(j, "adamw_step", 0);
  if (const Json* crc = Member(j, "crc32"); crc != nullptr) {
    f.has_checksums = true;
    if (crc->is_object()) {
      for (const auto& [file, value] : crc->items()) {
        if (value.is_number_unsigned()) f.crc32[file] = value.get<uint64_t>();
      }
    }
  }
  return f;
}

}  // namespace rp::files
