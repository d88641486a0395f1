#include "workers/text/byte_level.h"

#include <array>

namespace rp::workers::text {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 512> to_byte{};  // every alphabet codepoint is below 256 + 68
};

bool Printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

const Tables& Table() {
  static const Tables t = [] {
    Tables t;
    t.to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      t.to_cp[b] = Printable(b) ? static_cast<uint32_t>(b) : next++;
      AppendUtf8(t.to_cp[b], &t.to_utf8[b]);
      t.to_byte[t.to_cp[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return t;
}

}  // namespace

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Well-formed UTF-8 (Unicode Table 3-7). On a malformed sequence the maximal well-formed prefix
// (at least one byte) is consumed and U+FFFD returned: one replacement per maximal subpart, as
// Rust's from_utf8_lossy does.
uint32_t NextCodepoint(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const size_t i = *pos;
  const unsigned char c = p[i];
  if (c < 0x80) {
    *pos = i + 1;
    return c;
  }
  int len = 0;
  uint32_t cp = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *pos = i + 1;
    return 0xFFFD;
  }
  for (int k = 1; k < len; ++k) {
    const unsigned char lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
    if (i + k >= n || p[i + k] < lo_k || p[i + k] > hi_k) {
      *pos = i + k;
      return 0xFFFD;
    }
    cp = (cp << 6) | (p[i + k] & 0x3F);
  }
  *pos = i + len;
  return cp;
}

void ByteLevelEncode(std::string_view bytes, std::string* out) {
  const Tables& t = Table();
  for (unsigned char b : bytes) out->append(t.to_utf8[b]);
}

int ByteLevelByte(uint32_t cp) { return cp < Table().to_byte.size() ? Table().to_byte[cp] : -1; }

bool ByteLevelDecodeToken(std::string_view token, std::string* out) {
  const size_t start = out->size();
  for (size_t i = 0; i < token.size();) {
    const int b = ByteLevelByte(NextCodepoint(token, &i));
    if (b < 0) {
      out->resize(start);
      out->append(token);
      return false;
    }
    out->push_back(static_cast<char>(b));
  }
  return true;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const size_t start = i;
    const uint32_t cp = NextCodepoint(bytes, &i);
    if (cp == 0xFFFD && !(i - start == 3 && bytes.substr(start, 3) == "\xEF\xBF\xBD")) {
      AppendUtf8(0xFFFD, &out);
    } else {
      out.append(bytes.substr(start, i - start));
    }
  }
  return out;
}

}  // namespace rp::workers::text
