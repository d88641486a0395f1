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
#include "workers/files/confined_fs.h"

namespace rp::workers::io {

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

at::ScalarType ToScalarType(const std::string& s) {
  static const std::map<std::string, at::ScalarType> kDtypes = {
      {"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}, {"F64", at::kDouble}, {"I64", at::kLong},
      {"I32", at::kInt},   {"I16", at::kShort},     {"I8", at::kChar},  {"U8", at::kByte},    {"BOOL", at::kBool}};
  return kDtypes.at(s);  // files::ParseSafetensorsHeader admits only these names
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(const_cast<unsigned char*>(map_), size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  // Regular files beneath the daemon's roots only (confined_fs): a FIFO never blocks.
  uint64_t bytes = 0;
  auto fd = files::OpenForRead(path, &bytes);
  if (!fd.ok()) return absl::Status(fd.status().code(), absl::StrCat("safetensors: ", fd.status().message()));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(bytes);
  if (f->size_ < 8) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: '", path, "' is truncated (", f->size_, " bytes)"));
  }
  // Private and writable: a write through a View() lands in a private copy of that page.
  void* m = mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd->get(), 0);
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
  auto entries = files::ParseSafetensorsHeader(header, f->size_ - 8 - n, &f->metadata_);
  if (!entries.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", entries.status().message()));
  }
  for (auto& e : *entries) f->tensors_.push_back({e.name, ToScalarType(e.dtype), e.shape, e.begin, e.end});
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

absl::StatusOr<at::Tensor> SafetensorsFile::View(const std::shared_ptr<const SafetensorsFile>& file,
                                                 const std::string& name) {
  const TensorInfo* t = file->Find(name);
  if (!t) return absl::NotFoundError(absl::StrCat("'", file->path_, "' has no tensor '", name, "'"));
  unsigned char* p = const_cast<unsigned char*>(file->data_ + t->begin);
  if (reinterpret_cast<uintptr_t>(p) % c10::elementSize(t->dtype) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("'", file->path_, "': tensor '", name, "' is not aligned"));
  }
  return at::from_blob(
      p, t->shape, [keep = file](void*) mutable { keep.reset(); }, at::TensorOptions().dtype(t->dtype));
}

}  // namespace rp::workers::io
