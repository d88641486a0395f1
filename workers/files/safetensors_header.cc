// The safetensors header parser: no LibTorch here (the header fuzzer builds this file alone).
#include "workers/files/safetensors_header.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "workers/files/bounded_json.h"

namespace rp::files {

namespace {

// Element size of a safetensors dtype name; 0 = unsupported.
int ElementBytes(const std::string& s) {
  static const std::map<std::string, int> kDtypes = {{"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F64", 8}, {"I64", 8},
                                                     {"I32", 4}, {"I16", 2},  {"I8", 1},  {"U8", 1},  {"BOOL", 1}};
  auto it = kDtypes.find(s);
  return it == kDtypes.end() ? 0 : it->second;
}

}  // namespace

absl::StatusOr<std::vector<HeaderEntry>> ParseSafetensorsHeader(const std::string& header, uint64_t data_bytes,
                                                                std::map<std::string, std::string>* metadata) {
  auto parsed = ParseBoundedJson(header, "safetensors: the header");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) return absl::InvalidArgumentError("safetensors: the header is not a JSON object");
  std::vector<HeaderEntry> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it.value().is_object()) return absl::InvalidArgumentError("safetensors: __metadata__ is not an object");
      if (metadata != nullptr) {
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          if (m.value().is_string()) (*metadata)[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    const nlohmann::json& v = it.value();
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "': ", what));
    };
    if (!v.is_object()) return bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) return bad("no dtype");
    HeaderEntry t;
    t.name = name;
    t.dtype = v["dtype"].get<std::string>();
    t.element_bytes = ElementBytes(t.dtype);
    if (t.element_bytes == 0) return bad(absl::StrCat("unsupported dtype ", t.dtype));
    if (!v.contains("shape") || !v["shape"].is_array()) return bad("no shape");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad("shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > 0 && numel > (uint64_t{1} << 62) / dim) return bad("shape too large");
      numel *= dim;
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2 ||
        !v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned()) {
      return bad("data_offsets must be two non-negative integers");
    }
    t.begin = v["data_offsets"][0].get<uint64_t>();
    t.end = v["data_offsets"][1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_bytes) {
      return bad(absl::StrCat("data_offsets [", t.begin, ", ", t.end, "] outside the ", data_bytes, " data bytes"));
    }
    if (t.end - t.begin != numel * static_cast<uint64_t>(t.element_bytes)) {
      return bad(absl::StrCat("data_offsets span ", t.end - t.begin, " bytes, the shape needs ",
                              numel * static_cast<uint64_t>(t.element_bytes)));
    }
    out.push_back(std::move(t));
  }
  std::vector<const HeaderEntry*> by_offset;
  for (const auto& t : out) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensors '", by_offset[i - 1]->name, "' and '", by_offset[i]->name, "' overlap"));
    }
  }
  return out;
}

}  // namespace rp::files
