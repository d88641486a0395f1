#include "workers/io/safetensors_reader.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace rp::workers::io {

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

bool DtypeFromName(const std::string& s, at::ScalarType* out) {
  static const std::map<std::string, at::ScalarType> kDtypes = {
      {"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}, {"F64", at::kDouble}, {"I64", at::kLong},
      {"I32", at::kInt},   {"I16", at::kShort},     {"I8", at::kChar},  {"U8", at::kByte},    {"BOOL", at::kBool}};
  auto it = kDtypes.find(s);
  if (it == kDtypes.end()) return false;
  *out = it->second;
  return true;
}

}  // namespace

absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(const std::string& header, uint64_t data_bytes) {
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("safetensors: the header is not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("safetensors: the header is not a JSON object");
  std::vector<TensorInfo> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it.value().is_object()) return absl::InvalidArgumentError("safetensors: __metadata__ is not an object");
      continue;
    }
    const nlohmann::json& v = it.value();
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", name, "': ", what));
    };
    if (!v.is_object()) return bad("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) return bad("no dtype");
    TensorInfo t;
    t.name = name;
    if (!DtypeFromName(v["dtype"].get<std::string>(), &t.dtype)) {
      return bad(absl::StrCat("unsupported dtype ", v["dtype"].get<std::string>()));
    }
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
    if (t.end - t.begin != numel * c10::elementSize(t.dtype)) {
      return bad(absl::StrCat("data_offsets span ", t.end - t.begin, " bytes, the shape needs ",
                              numel * c10::elementSize(t.dtype)));
    }
    out.push_back(std::move(t));
  }
  std::vector<const TensorInfo*> by_offset;
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

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<unsigned char*>(map_), size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("safetensors: cannot open '", path, "': ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("safetensors: '", path, "' is not a regular file"));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("safetensors: '", path, "' is truncated (", f->size_, " bytes)"));
  }
  void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED)
    return absl::InternalError(absl::StrCat("safetensors: mmap '", path, "': ", std::strerror(errno)));
  f->map_ = static_cast<const unsigned char*>(m);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(f->map_[i]) << (8 * i);
  if (n > kMaxHeaderBytes || n > f->size_ - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: '", path, "': header length ", n, " runs beyond the file (", f->size_, " bytes)"));
  }
  const std::string header(reinterpret_cast<const char*>(f->map_ + 8), n);
  auto tensors = ParseSafetensorsHeader(header, f->size_ - 8 - n);
  if (!tensors.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", tensors.status().message()));
  }
  f->tensors_ = std::move(*tensors);
  f->data_ = f->map_ + 8 + n;
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<at::Tensor> SafetensorsFile::Read(const std::string& name, at::ScalarType dtype) const {
  const TensorInfo* t = Find(name);
  if (!t) return absl::NotFoundError(absl::StrCat("'", path_, "' has no tensor '", name, "'"));
  // from_blob over the read-only mapping (never written), then a converting copy.
  at::Tensor view =
      at::from_blob(const_cast<unsigned char*>(data_ + t->begin), t->shape, at::TensorOptions().dtype(t->dtype));
  return view.to(dtype, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace rp::workers::io
