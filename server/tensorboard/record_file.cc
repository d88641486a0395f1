// TFRecord framing (record_file.h).
#include "server/tensorboard/record_file.h"

#include <cstring>

#include "server/tensorboard/crc32c.h"

namespace rp::tensorboard {
namespace {

void PutLittleEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}

uint64_t GetLittleEndian(std::string_view in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[static_cast<size_t>(i)])) << (8 * i);
  return v;
}

constexpr size_t kHeader = 8 + 4;  // length, its masked CRC
constexpr size_t kFooter = 4;      // the data's masked CRC

}  // namespace

std::string FrameRecord(std::string_view data) {
  std::string out;
  out.reserve(kHeader + data.size() + kFooter);
  PutLittleEndian(&out, data.size(), 8);
  PutLittleEndian(&out, MaskCrc(Crc32c(std::string_view(out.data(), 8))), 4);
  out.append(data);
  PutLittleEndian(&out, MaskCrc(Crc32c(data)), 4);
  return out;
}

ParsedRecords ParseRecords(std::string_view bytes, int64_t max_record_bytes) {
  ParsedRecords r;
  size_t at = 0;
  while (at < bytes.size()) {
    const std::string_view rest = bytes.substr(at);
    if (rest.size() < kHeader) break;
    const uint64_t length = GetLittleEndian(rest, 8);
    if (GetLittleEndian(rest.substr(8), 4) != MaskCrc(Crc32c(rest.substr(0, 8)))) break;
    if (length > static_cast<uint64_t>(max_record_bytes) || rest.size() - kHeader < length + kFooter) break;
    const std::string_view data = rest.substr(kHeader, length);
    if (GetLittleEndian(rest.substr(kHeader + length), 4) != MaskCrc(Crc32c(data))) break;
    r.records.emplace_back(data);
    at += kHeader + length + kFooter;
  }
  r.intact_bytes = static_cast<int64_t>(at);
  r.damaged_tail = at < bytes.size();
  return r;
}

}  // namespace rp::tensorboard
