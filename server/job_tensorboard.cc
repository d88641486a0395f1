// A job's TensorBoard log (job_tensorboard.h).
#include "server/job_tensorboard.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "scheduler/job_files.h"
#include "server/job_manager_internal.h"

namespace rp::server {
namespace {

namespace v1 = roundpipe::v1;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using HParams = std::vector<std::pair<std::string, tensorboard::EventLog::HParam>>;

double WallTime() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// A repeated scalar field as one comma-separated string ("q_proj,v_proj", "3,3,2").
std::string JoinRepeated(const Message& msg, const FieldDescriptor* f) {
  const google::protobuf::Reflection* r = msg.GetReflection();
  std::string out;
  const int n = std::min(r->FieldSize(msg, f), 64);
  for (int i = 0; i < n; ++i) {
    if (i > 0) out += ",";
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        out += r->GetRepeatedString(msg, f, i);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        out += std::to_string(r->GetRepeatedInt32(msg, f, i));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        out += std::to_string(r->GetRepeatedInt64(msg, f, i));
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        out += r->GetRepeatedEnum(msg, f, i)->name();
        break;
      default:
        out += "?";  // no other repeated scalar in the spec
        break;
    }
  }
  return out;
}

void Flatten(const Message& msg, const std::string& prefix, int depth, HParams* out) {
  if (depth > 8) return;  // specs are shallow; a bound all the same
  const google::protobuf::Reflection* r = msg.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(msg, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string name = prefix.empty() ? f->name() : prefix + "." + f->name();
    if (f->is_repeated()) {
      if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) out->emplace_back(name, JoinRepeated(msg, f));
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        Flatten(r->GetMessage(msg, f), name, depth + 1, out);
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        if (f->type() != FieldDescriptor::TYPE_BYTES) out->emplace_back(name, r->GetString(msg, f));
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        out->emplace_back(name, r->GetEnum(msg, f)->name());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        out->emplace_back(name, r->GetBool(msg, f));
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        out->emplace_back(name, static_cast<double>(r->GetInt32(msg, f)));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        out->emplace_back(name, static_cast<double>(r->GetInt64(msg, f)));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        out->emplace_back(name, static_cast<double>(r->GetUInt32(msg, f)));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        out->emplace_back(name, static_cast<double>(r->GetUInt64(msg, f)));
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        out->emplace_back(name, static_cast<double>(r->GetFloat(msg, f)));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        out->emplace_back(name, r->GetDouble(msg, f));
        break;
    }
  }
}

}  // namespace

std::string SampleMarkdown(const v1::Sample& s) {
  // Fenced, so that the model's output shows as it is (a fence inside it cannot close ours).
  std::string fence = "```";
  while (s.prompt().find(fence) != std::string::npos || s.completion().find(fence) != std::string::npos) fence += "`";
  return absl::StrCat("**prompt**\n\n", fence, "\n", s.prompt(), "\n", fence, "\n\n**completion**\n\n", fence, "\n",
                      s.completion(), "\n", fence);
}

tensorboard::EventLog::Scalars StepScalars(const scheduler::IterationStats& st, const v1::StepMetrics& m) {
  return {{"train/loss", m.loss()},
          {"train/learning_rate", m.learning_rate()},
          {"train/grad_norm", m.grad_norm()},
          {"train/loss_scale", st.loss_scale},
          {"train/tokens_per_second", m.tokens_per_second()},
          {"train/bubble_ratio", m.bubble_ratio()},
          {"train/host_state_bytes", static_cast<double>(st.host_state_bytes)},
          {"train/step_seconds", st.seconds}};
}

HParams SpecHParams(const Message& spec) {
  HParams out;
  Flatten(spec, "", 0, &out);
  return out;
}

JobTensorBoard::JobTensorBoard(const std::string& job_id, const v1::Job& record, const std::string& output_dir,
                               bool evaluated_at_resume)
    : job_id_(job_id),
      dir_((std::filesystem::path(output_dir) / "tensorboard").string()),
      resume_step_(record.progress().step()),
      evaluated_at_resume_(evaluated_at_resume),
      enabled_(!record.spec().tensorboard().disabled()),
      spec_(record.spec()) {}

void JobTensorBoard::Open() {
  enabled_ = false;  // one attempt
  // Opened beneath the daemon's roots at the moment of use: an output dir swapped for a symlink
  // leading out is refused.
  auto fd = scheduler::OpenConfinedDirectory(dir_, /*create=*/true);
  if (!fd.ok()) {
    JobLog()->warn("[{}] no TensorBoard log: {}", job_id_, fd.status().ToString());
    return;
  }
  tensorboard::EventLog::Resume resume{resume_step_, {}};
  if (!evaluated_at_resume_) resume.redo_at_step = {"eval/", "samples/"};
  auto log = tensorboard::EventLog::OpenAt(*fd, dir_, resume);
  if (!log.ok()) {
    JobLog()->warn("[{}] no TensorBoard log: {}", job_id_, log.status().ToString());
    return;
  }
  log_ = std::move(*log);
  for (const std::string& note : log_->notes()) JobLog()->warn("[{}] TensorBoard log: {}", job_id_, note);
  if (log_->dropped_records() > 0) {
    JobLog()->info("[{}] TensorBoard log: resumed at step {}; {} records of later steps dropped (they run again)",
                   job_id_, resume_step_, log_->dropped_records());
  }
  Check(log_->AddHParams(SpecHParams(spec_), job_id_, WallTime()));
}

void JobTensorBoard::OnEvent(const scheduler::JobEvent& e, const v1::JobEvent& out) {
  const bool logged = e.kind == scheduler::JobEvent::Kind::kIteration || e.kind == scheduler::JobEvent::Kind::kEval;
  if (!logged) return;
  if (!log_ && enabled_) Open();
  if (!log_) return;
  if (e.kind == scheduler::JobEvent::Kind::kIteration && out.has_step()) {
    Check(log_->AddScalars(out.step().step(), StepScalars(e.stats, out.step()), WallTime()));
  } else if (e.kind == scheduler::JobEvent::Kind::kEval && out.has_eval()) {
    const v1::EvalMetrics& m = out.eval();
    Check(log_->AddScalars(m.step(), {{"eval/loss", m.loss()}, {"eval/best_loss", m.best_loss()}}, WallTime()));
    for (int i = 0; i < m.samples_size() && log_; ++i) {
      Check(log_->AddText(m.step(), absl::StrCat("samples/", i), SampleMarkdown(m.samples(i)), WallTime()));
    }
  }
}

void JobTensorBoard::Check(const absl::Status& st) {
  if (st.ok()) return;
  JobLog()->warn("[{}] TensorBoard logging stopped: {}", job_id_, st.ToString());
  log_.reset();
}

}  // namespace rp::server
