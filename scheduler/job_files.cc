#include "scheduler/job_files.h"

#include <fcntl.h>

#include <ATen/ATen.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "scheduler/runtime/base_source.h"
#include "scheduler/runtime/export.h"
#include "scheduler/runtime/job_builder.h"
#include "scheduler/runtime/jsonl_documents.h"
#include "scheduler/runtime/model_adapter.h"
#include "workers/files/atomic_dir.h"
#include "workers/files/confined_fs.h"
#include "workers/io/checkpoint.h"
#include "workers/io/hf_config.h"
#include "workers/io/hf_tensors.h"
#include "workers/io/safetensors_reader.h"

namespace rp::scheduler {

namespace io = workers::io;

absl::Status ConfineFileAccess(const std::vector<std::string>& roots) { return files::ConfineTo(roots); }

std::vector<CheckpointInfo> ListJobCheckpoints(const std::string& root, std::vector<std::string>* skipped) {
  std::vector<CheckpointInfo> out;
  for (const std::string& dir : io::ListCheckpoints(root)) {
    auto meta = io::ReadCheckpointMeta(dir);
    if (!meta.ok()) {
      if (skipped) skipped->push_back(absl::StrCat(dir, ": ", meta.status().message()));
      continue;
    }
    out.push_back({dir, meta->step, meta->batches_consumed});
  }
  return out;
}

absl::StatusOr<int64_t> ExportCheckpoint(const std::string& checkpoint_dir, const JobSpec& job,
                                         const std::string& out_dir, ExportKind kind, const StopCheck& stop) {
  if (absl::Status st = job.model.Validate(); !st.ok()) return st;
  auto f = io::SafetensorsFile::Open(checkpoint_dir + "/weights.safetensors");
  if (!f.ok()) return f.status();
  auto record = io::ReadCheckpointBase(checkpoint_dir);
  if (!record.ok()) return record.status();
  const at::ScalarType dtype = runtime::ToScalarType(job.precision);
  std::vector<ParameterShape> shapes;
  for (const auto& t : (*f)->tensors()) shapes.push_back({t.name, t.shape});
  for (const auto& t : record->tensors) shapes.push_back({t.name, t.shape});
  runtime::BaseSource base(job.model, dtype, job.hf_dir, job.seed, std::move(*record));
  io::SafetensorsFile* weights = f->get();
  return runtime::WriteExport(
      out_dir, job.model, shapes,
      [weights, &base](const std::string& name) -> absl::StatusOr<at::Tensor> {
        if (weights->Find(name)) return weights->Read(name, at::kFloat);
        return base.Read(name);
      },
      dtype, kind, stop);
}

absl::StatusOr<int64_t> PredictHostStateBytes(const JobSpec& job) { return runtime::PredictHostStateBytes(job); }

int64_t TokenizerParseBytesInFlight() { return runtime::TokenizerParseBytesInFlight(); }

absl::Status ClaimOutputDir(const std::string& dir, const std::string& owner) {
  if (absl::Status st = files::MakeDirs(dir); !st.ok()) return st;
  const std::string path = absl::StrCat(dir, "/", kOutputClaimFile);
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::Status st = files::WriteNewFile(path, owner + "\n");
    if (st.ok()) return st;
    if (!absl::IsAlreadyExists(st)) return st;
    auto text = files::ReadSmallFile(path, 4096);
    if (!text.ok()) return text.status();
    const std::string holder(absl::StripAsciiWhitespace(*text));
    if (holder == owner) return absl::OkStatus();
    if (holder.empty()) {  // a claim torn by a crash between create and write: take it over
      (void)files::RemoveTree(path);
      continue;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("output_dir '", dir, "' belongs to job ", holder.substr(0, holder.find(' ')), " (",
                     kOutputClaimFile, "); give each job its own output_dir (or delete that directory)"));
  }
  return absl::UnavailableError(absl::StrCat("output_dir '", dir, "': the claim keeps changing"));
}

void ReleaseOutputDir(const std::string& dir) { (void)files::RemoveTree(absl::StrCat(dir, "/", kOutputClaimFile)); }

absl::StatusOr<int> OpenConfinedDirectory(const std::string& dir, bool create) {
  if (create) {
    if (absl::Status st = files::MakeDirs(dir); !st.ok()) return st;
  }
  auto fd = files::OpenConfined(dir, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) return fd.status();
  return fd->release();
}

int RemoveTornWrite(const std::string& target) { return files::RemoveTornTemporaries(target); }

}  // namespace rp::scheduler
