// libFuzzer target: a token dataset file (safetensors, "roundpipe.token_dataset.v1"): the header
// (workers/files/safetensors_header.cc), the layout rules and the value checks
// (scheduler/runtime/token_dataset_layout.cc) on the file's own bytes. Accepted files give ids in
// [0, 2^31) and document starts that rise strictly below the token count.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/runtime/token_dataset_layout.h"
#include "workers/files/safetensors_header.h"

namespace {

using rp::scheduler::runtime::TokenElement;
using rp::scheduler::runtime::TokenTensor;

TokenElement ElementOf(const std::string& dtype) {
  if (dtype == "I32") return TokenElement::kInt32;
  if (dtype == "I64") return TokenElement::kInt64;
  if (dtype == "U8") return TokenElement::kUInt8;
  if (dtype == "BOOL") return TokenElement::kBool;
  if (dtype == "I16") return TokenElement::kInt16;
  return TokenElement::kOther;
}

// The tensor's elements widened to int64 (I32 or I64 only, as the layout allows for ids/offsets).
std::vector<int64_t> Widened(const rp::files::HeaderEntry& e, const uint8_t* data) {
  std::vector<int64_t> out;
  const uint64_t bytes = e.end - e.begin;
  if (e.dtype == "I64") {
    out.resize(bytes / 8);
    std::memcpy(out.data(), data + e.begin, out.size() * 8);
  } else {
    std::vector<int32_t> narrow(bytes / 4);
    std::memcpy(narrow.data(), data + e.begin, narrow.size() * 4);
    out.assign(narrow.begin(), narrow.end());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  if (header_len > size - 8) return 0;
  const std::string header(reinterpret_cast<const char*>(data + 8), header_len);
  const uint8_t* payload = data + 8 + header_len;
  const uint64_t payload_bytes = size - 8 - header_len;
  std::map<std::string, std::string> metadata;
  auto entries = rp::files::ParseSafetensorsHeader(header, payload_bytes, &metadata);
  if (!entries.ok()) return 0;
  std::map<std::string, const rp::files::HeaderEntry*> by_name;
  for (const auto& e : *entries) by_name[e.name] = &e;
  auto tensor = [&](const char* name) -> std::optional<TokenTensor> {
    auto it = by_name.find(name);
    if (it == by_name.end()) return std::nullopt;
    return TokenTensor{ElementOf(it->second->dtype), it->second->shape};
  };
  const auto ids = tensor("input_ids"), mask = tensor("loss_mask"), offsets = tensor("document_offsets");
  auto fmt = metadata.find("format");
  auto n = rp::scheduler::runtime::CheckTokenDatasetLayout("f", fmt == metadata.end() ? nullptr : &fmt->second,
                                                           ids ? &*ids : nullptr, mask ? &*mask : nullptr,
                                                           offsets ? &*offsets : nullptr);
  if (!n.ok()) return 0;
  const std::vector<int64_t> values = Widened(*by_name["input_ids"], payload);
  if (static_cast<int64_t>(values.size()) != *n) std::abort();
  const bool ids_ok = rp::scheduler::runtime::CheckTokenIds("f", values.data(), *n, 0).ok();
  for (int64_t v : values) {
    if (ids_ok && (v < 0 || v > INT32_MAX)) std::abort();
  }
  if (offsets) {
    const std::vector<int64_t> o = Widened(*by_name["document_offsets"], payload);
    auto starts = rp::scheduler::runtime::DocumentStarts("f", o.data(), static_cast<int64_t>(o.size()), *n);
    if (starts.ok()) {
      for (size_t i = 0; i < starts->size(); ++i) {
        if ((*starts)[i] < 0 || (*starts)[i] >= *n || (i > 0 && (*starts)[i] <= (*starts)[i - 1])) std::abort();
      }
    }
  }
  return 0;
}
