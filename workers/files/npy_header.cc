#include "workers/files/npy_header.h"

#include <cstring>
#include <limits>
#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"

namespace rp::files {

namespace {

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(absl::StrCat(".npy: ", what)); }

// The text after `'key':` in the header dict (spaces skipped), or npos.
size_t ValueOf(absl::string_view h, absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "'");
  const size_t k = h.find(quoted);
  if (k == absl::string_view::npos) return k;
  size_t i = k + quoted.size();
  while (i < h.size() && h[i] == ' ') ++i;
  if (i >= h.size() || h[i] != ':') return absl::string_view::npos;
  ++i;
  while (i < h.size() && h[i] == ' ') ++i;
  return i;
}

}  // namespace

absl::StatusOr<NpyLayout> ParseNpyHeader(const unsigned char* p, size_t size) {
  if (size < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) return Bad("not a .npy file (bad magic)");
  const int major = p[6];
  uint64_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<uint64_t>(p[8]) | (static_cast<uint64_t>(p[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return Bad("truncated header");
    header_len = static_cast<uint64_t>(p[8]) | (static_cast<uint64_t>(p[9]) << 8) |
                 (static_cast<uint64_t>(p[10]) << 16) | (static_cast<uint64_t>(p[11]) << 24);
    start = 12;
  } else {
    return Bad(absl::StrCat("unsupported version ", major));
  }
  if (header_len > size - start) return Bad("header runs past the end of the file");
  const absl::string_view h(reinterpret_cast<const char*>(p + start), static_cast<size_t>(header_len));

  // descr: '<u2', '|u2', '=i8', ...
  size_t d = ValueOf(h, "descr");
  if (d == absl::string_view::npos || d >= h.size() || h[d] != '\'') return Bad("no descr in header");
  const size_t d_end = h.find('\'', d + 1);
  if (d_end == absl::string_view::npos) return Bad("unterminated descr");
  absl::string_view descr = h.substr(d + 1, d_end - d - 1);
  if (!descr.empty() && (descr[0] == '<' || descr[0] == '|' || descr[0] == '=' || descr[0] == '>')) {
    if (descr[0] == '>') return Bad("big-endian data is not supported");
    descr.remove_prefix(1);
  }
  NpyLayout out;
  if (descr == "u2") {
    out.element_bytes = 2;
  } else if (descr == "u4") {
    out.element_bytes = 4;
  } else if (descr == "i4") {
    out.element_bytes = 4;
    out.is_signed = true;
  } else if (descr == "i8") {
    out.element_bytes = 8;
    out.is_signed = true;
  } else {
    return Bad(
        absl::StrCat("token dtype '", descr.substr(0, 16), "' not supported (use uint16, uint32, int32 or int64)"));
  }

  const size_t f = ValueOf(h, "fortran_order");
  if (f != absl::string_view::npos && h.substr(f, 4) == "True") return Bad("fortran_order arrays are not supported");

  // shape: (n,) or (a, b) — decimal digits only, every product checked against int64.
  size_t s = ValueOf(h, "shape");
  if (s == absl::string_view::npos || s >= h.size() || h[s] != '(') return Bad("no shape in header");
  const size_t s_end = h.find(')', s);
  if (s_end == absl::string_view::npos) return Bad("unterminated shape");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t count = 1;
  int dims = 0;
  size_t i = s + 1;
  while (i < s_end) {
    const char c = h[i];
    if (c == ' ' || c == ',') {
      ++i;
      continue;
    }
    if (c < '0' || c > '9') return Bad(absl::StrCat("shape: unexpected character '", std::string(1, c), "'"));
    int64_t dim = 0;
    for (; i < s_end && h[i] >= '0' && h[i] <= '9'; ++i) {
      const int digit = h[i] - '0';
      if (dim > (kMax - digit) / 10) return Bad("shape: a dimension does not fit in 64 bits");
      dim = dim * 10 + digit;
    }
    if (dim != 0 && count > kMax / dim) return Bad("shape: the element count does not fit in 64 bits");
    count *= dim;
    if (++dims > 32) return Bad("shape: more than 32 dimensions");
  }
  if (dims > 2) return Bad(absl::StrCat("shape: token arrays are 1-d or 2-d, got ", dims, " dimensions"));
  if (count > kMax / out.element_bytes) return Bad("shape: the byte size does not fit in 64 bits");
  out.data_offset = static_cast<size_t>(start + header_len);
  out.count = count;
  const uint64_t payload = static_cast<uint64_t>(count) * static_cast<uint64_t>(out.element_bytes);
  if (payload > size - out.data_offset) return Bad("the shape promises more data than the file holds");
  return out;
}

}  // namespace rp::files
