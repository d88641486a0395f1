#include "workers/io/frozen_base.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <zlib.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "workers/base/json_depth.h"
#include "workers/io/safetensors_writer.h"
#include "workers/store/host_model_store.h"

namespace rp::workers::io {

namespace {

constexpr int64_t kPiece = int64_t{16} << 20;  // bytes per CRC piece (parallel work unit)

struct Piece {
  const unsigned char* data;
  int64_t size;
  uint32_t crc = 0;
};

// CRC-32 of `pieces` (consecutive pieces of one or more buffers) in parallel, then each buffer's
// CRC by combining its pieces in order: the same value as one pass over the buffer.
void CrcPieces(std::vector<Piece>& pieces) {
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      Piece& p = pieces[static_cast<size_t>(i)];
      p.crc = static_cast<uint32_t>(crc32_z(crc32_z(0L, Z_NULL, 0), p.data, static_cast<size_t>(p.size)));
    }
  });
}

void AddPieces(const at::Tensor& t, std::vector<Piece>* out) {
  const auto* base = static_cast<const unsigned char*>(t.const_data_ptr());
  const int64_t n = static_cast<int64_t>(t.nbytes());
  int64_t off = 0;
  do {  // an empty tensor is one empty piece
    out->push_back({base + off, std::min(kPiece, n - off)});
    off += kPiece;
  } while (off < n);
}

uint32_t Combine(const std::vector<Piece>& pieces, size_t begin, size_t end) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  for (size_t i = begin; i < end; ++i) crc = crc32_combine(crc, pieces[i].crc, static_cast<z_off_t>(pieces[i].size));
  return static_cast<uint32_t>(crc);
}

// The fingerprint: a CRC-32 over every entry's name, dtype, shape and CRC, in order.
std::string Fingerprint(const std::vector<FrozenTensor>& tensors) {
  if (tensors.empty()) return "";
  std::string text;
  for (const FrozenTensor& t : tensors) {
    absl::StrAppend(&text, t.name, "\n", t.dtype, "\n", absl::StrJoin(t.shape, ","), "\n", t.crc32, "\n");
  }
  const uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const unsigned char*>(text.data()), text.size());
  return absl::StrFormat("%08x", static_cast<uint32_t>(crc));
}

// Bytes of an entry; false when the shape's product overflows (damage).
bool Bytes(const FrozenTensor& t, int64_t* out) {
  int64_t n = t.dtype == "F32" ? 4 : 2;
  for (int64_t d : t.shape) {
    if (__builtin_mul_overflow(n, d, &n)) return false;
  }
  *out = n;
  return true;
}

}  // namespace

const FrozenTensor* FrozenBase::Find(const std::string& name) const {
  for (const FrozenTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

uint32_t TensorCrc32(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::vector<Piece> pieces;
  AddPieces(c, &pieces);
  CrcPieces(pieces);
  return Combine(pieces, 0, pieces.size());
}

FrozenBase DescribeFrozenBase(const HostModelStore& store) {
  FrozenBase base;
  std::vector<Piece> pieces;
  std::vector<size_t> first;  // per frozen tensor: its first piece
  std::vector<at::Tensor> keep;
  for (int i = 0; i < store.num_params(); ++i) {
    const HostParam& p = store.param(i);
    if (p.trainable) continue;
    FrozenTensor t;
    t.name = p.name;
    t.shape = p.shape;
    // The masters are fp32, bf16 or fp16: all have a name (the store allows nothing else).
    (void)SafetensorsDtypeName(p.master.scalar_type(), &t.dtype);
    keep.push_back(p.master.contiguous());
    first.push_back(pieces.size());
    AddPieces(keep.back(), &pieces);
    base.bytes += static_cast<int64_t>(keep.back().nbytes());
    base.tensors.push_back(std::move(t));
  }
  CrcPieces(pieces);
  for (size_t k = 0; k < base.tensors.size(); ++k) {
    base.tensors[k].crc32 = Combine(pieces, first[k], k + 1 < first.size() ? first[k + 1] : pieces.size());
  }
  base.fingerprint = Fingerprint(base.tensors);
  return base;
}

absl::Status SameFrozenBase(const FrozenBase& recorded, const FrozenBase& actual, const std::string& what) {
  if (recorded.fingerprint == actual.fingerprint) return absl::OkStatus();
  const std::string fix =
      "; resume with the base (model.hf_dir, model.init_seed, precision) it was trained on, or start a new job";
  for (const FrozenTensor& r : recorded.tensors) {
    const FrozenTensor* a = actual.Find(r.name);
    if (!a) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " was trained on a base with tensor ", r.name, ", which this job's base lacks", fix));
    }
    if (a->dtype != r.dtype) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": base tensor ", r.name, " was ", r.dtype, ", this job's is ", a->dtype, fix));
    }
    if (a->shape != r.shape) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": base tensor ", r.name, " had shape [",
                                                        absl::StrJoin(r.shape, ","), "], this job's has [",
                                                        absl::StrJoin(a->shape, ","), "]", fix));
    }
    if (a->crc32 != r.crc32) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": base tensor ", r.name, " has other values than the base it was trained on", fix));
    }
  }
  for (const FrozenTensor& a : actual.tensors) {
    if (!recorded.Find(a.name)) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": this job freezes ", a.name, ", which the checkpoint's base did not have", fix));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(what, ": the base's fingerprint ", actual.fingerprint,
                                                    " is not the checkpoint's ", recorded.fingerprint, fix));
}

std::string FrozenBaseJson(const FrozenBase& base) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const FrozenTensor& t : base.tensors) {
    tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}, {"crc32", t.crc32}});
  }
  nlohmann::json j = {{"fingerprint", base.fingerprint}, {"bytes", base.bytes}, {"tensors", tensors}};
  return j.dump(1) + "\n";
}

absl::StatusOr<FrozenBase> ParseFrozenBaseJson(const std::string& text) {
  if (!base::JsonDepthError(text).empty()) return absl::DataLossError("base.json: nested too deep");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  auto damaged = [](const std::string& why) { return absl::DataLossError(absl::StrCat("base.json: ", why)); };
  if (j.is_discarded() || !j.is_object() || !j.contains("tensors") || !j["tensors"].is_array() ||
      !j.contains("fingerprint") || !j["fingerprint"].is_string()) {
    return damaged("not a base record");
  }
  FrozenBase base;
  for (const auto& e : j["tensors"]) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("dtype") ||
        !e["dtype"].is_string() || !e.contains("shape") || !e["shape"].is_array() || !e.contains("crc32") ||
        !e["crc32"].is_number_unsigned() || e["crc32"].get<uint64_t>() > 0xffffffffu) {
      return damaged("an entry is malformed");
    }
    FrozenTensor t;
    t.name = e["name"].get<std::string>();
    t.dtype = e["dtype"].get<std::string>();
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16") return damaged("dtype " + t.dtype);
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) return damaged("a bad shape");
      t.shape.push_back(d.get<int64_t>());
    }
    t.crc32 = static_cast<uint32_t>(e["crc32"].get<uint64_t>());
    int64_t bytes = 0;
    if (!Bytes(t, &bytes) || __builtin_add_overflow(base.bytes, bytes, &base.bytes)) return damaged("a bad shape");
    base.tensors.push_back(std::move(t));
  }
  base.fingerprint = j["fingerprint"].get<std::string>();
  if (Fingerprint(base.tensors) != base.fingerprint) return damaged("the fingerprint does not match its entries");
  return base;
}

}  // namespace rp::workers::io
