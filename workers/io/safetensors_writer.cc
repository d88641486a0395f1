#include "workers/io/safetensors_writer.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "workers/files/confined_fs.h"

namespace rp::workers::io {

absl::Status SafetensorsDtypeName(at::ScalarType t, std::string* out) {
  switch (t) {
    case at::kFloat:
      *out = "F32";
      return absl::OkStatus();
    case at::kBFloat16:
      *out = "BF16";
      return absl::OkStatus();
    case at::kHalf:
      *out = "F16";
      return absl::OkStatus();
    case at::kDouble:
      *out = "F64";
      return absl::OkStatus();
    case at::kLong:
      *out = "I64";
      return absl::OkStatus();
    case at::kInt:
      *out = "I32";
      return absl::OkStatus();
    case at::kByte:
      *out = "U8";
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat("safetensors: cannot store dtype ", c10::toString(t)));
  }
}

int64_t NumBytes(const TensorDecl& d) {
  int64_t n = static_cast<int64_t>(c10::elementSize(d.dtype));
  for (int64_t s : d.shape) n *= s;
  return n;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (f_) std::fclose(f_);
}

absl::Status SafetensorsWriter::Open(const std::string& path, const std::vector<TensorDecl>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const TensorDecl& d : tensors) {
    std::string dt;
    if (absl::Status st = SafetensorsDtypeName(d.dtype, &dt); !st.ok()) return st;
    if (header.contains(d.name)) return absl::InvalidArgumentError(absl::StrCat("safetensors: duplicate ", d.name));
    const int64_t n = NumBytes(d);
    header[d.name] = {{"dtype", dt}, {"shape", d.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  // A new file beneath the daemon's roots (confined_fs): never replaces or follows what exists.
  auto fd = files::OpenConfined(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (!fd.ok()) return absl::Status(fd.status().code(), absl::StrCat("cannot create ", fd.status().message()));
  f_ = ::fdopen(fd->get(), "wb");
  if (!f_) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  fd->release();
  path_ = path;
  uint64_t len = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(len >> (8 * i));
  if (std::fwrite(le, 1, 8, f_) != 8 || std::fwrite(text.data(), 1, text.size(), f_) != text.size()) {
    return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
  }
  decls_ = tensors;
  next_ = 0;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Add(const at::Tensor& t) {
  if (!f_ || next_ >= decls_.size()) return absl::FailedPreconditionError("safetensors: no tensor left to write");
  const TensorDecl& d = decls_[next_];
  if (t.sizes().vec() != d.shape) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors: ", d.name, " has the wrong shape"));
  }
  at::Tensor c = t.to(at::kCPU).to(d.dtype).contiguous();
  const size_t n = c.nbytes();
  if (std::fwrite(c.data_ptr(), 1, n, f_) != n) {
    return absl::InternalError(absl::StrCat("write ", path_, ": ", std::strerror(errno)));
  }
  ++next_;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (!f_) return absl::FailedPreconditionError("safetensors: not open");
  if (next_ != decls_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("safetensors: ", decls_.size() - next_, " tensors not written"));
  }
  const bool ok = std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || !closed) {
    const int err = errno;
    const std::string text = absl::StrCat("flush ", path_, ": ", std::strerror(err));
    return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(text) : absl::InternalError(text);
  }
  return absl::OkStatus();
}

}  // namespace rp::workers::io
