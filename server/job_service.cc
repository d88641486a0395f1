#include "server/job_service.h"

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/status_util.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

namespace {

// Finishes a unary call with `result` (copied into *out when OK).
template <typename T>
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const absl::StatusOr<T>& result, T* out) {
  auto* r = ctx->DefaultReactor();
  if (result.ok()) *out = *result;
  r->Finish(ToGrpcStatus(result.status()));
  return r;
}

grpc::ServerUnaryReactor* Deny(grpc::CallbackServerContext* ctx, const grpc::Status& st) {
  auto* r = ctx->DefaultReactor();
  r->Finish(st);
  return r;
}

// StreamBatches: one outstanding read; the next read starts when the manager has queued the
// previous batch in the engine.
class BatchReader final : public grpc::ServerReadReactor<v1::Batch> {
 public:
  BatchReader(grpc::CallbackServerContext* ctx, JobManager* manager, const Authenticator* auth,
              v1::StreamSummary* summary)
      : ctx_(ctx), manager_(manager), summary_(summary) {
    if (grpc::Status st = auth->Check(*ctx); !st.ok()) {
      Finish(st);
      return;
    }
    StartRead(&batch_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed, or the call broke
      if (job_id_.empty()) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "StreamBatches: the stream carried no batch"));
        return;
      }
      // A broken stream keeps the job's input open: the client may reconnect and go on.
      if (!ctx_->IsCancelled()) (void)manager_->EndStream(job_id_, keep_open_);
      summary_->set_accepted(accepted_);
      summary_->set_rejected(0);
      summary_->set_message(keep_open_ || ctx_->IsCancelled() ? "input left open" : "input closed");
      Finish(grpc::Status::OK);
      return;
    }
    if (job_id_.empty()) {
      if (batch_.job_id().empty()) {
        Finish(
            grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "StreamBatches: job_id is required on the first batch"));
        return;
      }
      if (absl::Status st = Guarded("StreamBatches", [&] { return manager_->OpenStream(batch_.job_id()); }); !st.ok()) {
        Finish(ToGrpcStatus(st));
        return;
      }
      job_id_ = batch_.job_id();
      keep_open_ = batch_.keep_open();
    } else if (!batch_.job_id().empty() && batch_.job_id() != job_id_) {
      Finish(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("StreamBatches: one stream feeds one job (", job_id_, "), got a batch for ", batch_.job_id())));
      return;
    }
    // The manager may report the batch queued before FeedAsync returns (room in the queue) or
    // later from the engine's runner: act on it only once this handler is done with the call.
    {
      absl::MutexLock lock(&mu_);
      in_feed_ = true;
      early_.reset();
    }
    absl::Status st = Guarded("StreamBatches", [&] {
      return manager_->FeedAsync(job_id_, batch_, [this](absl::Status fed) { OnFed(fed); });
    });
    std::optional<absl::Status> early;
    {
      absl::MutexLock lock(&mu_);
      in_feed_ = false;
      early.swap(early_);
    }
    if (!st.ok()) {
      Finish(Rejected(st));  // (the manager does not run the callback then)
    } else if (early) {
      Continue(*early);
    }
  }

  void OnDone() override { delete this; }

 private:
  grpc::Status Rejected(const absl::Status& st) {
    absl::Status with_index(st.code(), absl::StrCat("batch #", accepted_ + 1, " of this stream: ", st.message(), " (",
                                                    accepted_, " earlier batches were accepted)"));
    return ToGrpcStatus(with_index);
  }
  void OnFed(const absl::Status& st) {  // inside FeedAsync, or later on the engine's runner thread
    {
      absl::MutexLock lock(&mu_);
      if (in_feed_) {
        early_ = st;
        return;
      }
    }
    Continue(st);
  }
  void Continue(const absl::Status& st) {
    if (!st.ok()) {
      Finish(Rejected(st));
      return;
    }
    ++accepted_;
    StartRead(&batch_);
  }

  grpc::CallbackServerContext* ctx_;
  JobManager* manager_;
  v1::StreamSummary* summary_;
  absl::Mutex mu_;
  bool in_feed_ ABSL_GUARDED_BY(mu_) = false;               // OnReadDone is inside FeedAsync
  std::optional<absl::Status> early_ ABSL_GUARDED_BY(mu_);  // the result reported meanwhile
  v1::Batch batch_;
  std::string job_id_;
  bool keep_open_ = false;
  int64_t accepted_ = 0;
};

// WatchJob: events queue in a channel the manager pushes into; the reactor writes them one at a
// time and finishes after the terminal state (or when the client goes away).
class EventWriter;
struct WatchChannel final : JobSubscriber {
  absl::Mutex mu;
  EventWriter* writer ABSL_GUARDED_BY(mu) = nullptr;  // null once the RPC is done
  std::deque<v1::JobEvent> queue ABSL_GUARDED_BY(mu);
  bool writing ABSL_GUARDED_BY(mu) = false;
  bool last ABSL_GUARDED_BY(mu) = false;
  bool finished ABSL_GUARDED_BY(mu) = false;
  bool OnEvent(const v1::JobEvent& e, bool is_last) override;
  void WriteDone(bool ok);
};

class EventWriter final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  EventWriter(grpc::CallbackServerContext* ctx, JobManager* manager, const Authenticator* auth,
              const v1::WatchJobRequest& req)
      : channel_(std::make_shared<WatchChannel>()) {
    if (grpc::Status st = auth->Check(*ctx); !st.ok()) {
      absl::MutexLock lock(&channel_->mu);  // not shared yet; the lock states the rule
      channel_->finished = true;
      Finish(st);
      return;
    }
    {
      absl::MutexLock lock(&channel_->mu);
      channel_->writer = this;
    }
    if (absl::Status st = Guarded("WatchJob", [&] { return manager->Subscribe(req.job_id(), channel_); }); !st.ok()) {
      absl::MutexLock lock(&channel_->mu);
      channel_->finished = true;
      Finish(ToGrpcStatus(st));
    }
  }
  void OnWriteDone(bool ok) override { channel_->WriteDone(ok); }
  void OnCancel() override {
    absl::MutexLock lock(&channel_->mu);
    if (!channel_->finished) {
      channel_->finished = true;
      Finish(grpc::Status::CANCELLED);
    }
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&channel_->mu);
      channel_->writer = nullptr;
    }
    delete this;
  }

 private:
  std::shared_ptr<WatchChannel> channel_;
};

bool WatchChannel::OnEvent(const v1::JobEvent& e, bool is_last) {
  absl::ReleasableMutexLock lock(&mu);
  if (!writer || finished) return false;
  if (e.event_case() == v1::JobEvent::EVENT_NOT_SET) {  // the daemon is going away
    finished = true;
    writer->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, e.message()));
    return false;
  }
  queue.push_back(e);
  last = last || is_last;
  if (!writing) {
    writing = true;
    const v1::JobEvent* front = &queue.front();
    EventWriter* w = writer;
    lock.Release();
    w->StartWrite(front);
  }
  return true;
}

void WatchChannel::WriteDone(bool ok) {
  absl::ReleasableMutexLock lock(&mu);
  queue.pop_front();
  if (finished || !writer) return;
  if (!ok) {  // the client went away
    finished = true;
    writer->Finish(grpc::Status::CANCELLED);
    return;
  }
  if (!queue.empty()) {
    const v1::JobEvent* front = &queue.front();
    EventWriter* w = writer;
    lock.Release();
    w->StartWrite(front);
    return;
  }
  writing = false;
  if (last) {
    finished = true;
    writer->Finish(grpc::Status::OK);
  }
}

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* ctx, const v1::SubmitJobRequest* req,
                                                    v1::Job* resp) {
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) return Deny(ctx, st);
  // Admission reads the model dir and token file: off the callback thread, so a slow or hostile
  // file system can never hold the threads every other RPC needs.
  auto* r = ctx->DefaultReactor();
  absl::Status queued = manager_->RunInBackground([this, r, req, resp] {
    auto job = Guarded("SubmitJob", [&] { return manager_->Submit(req->spec()); });
    if (job.ok()) *resp = *job;
    r->Finish(ToGrpcStatus(job.status()));
  });
  if (!queued.ok()) r->Finish(ToGrpcStatus(queued));
  return r;
}

grpc::ServerReadReactor<v1::Batch>* JobServiceImpl::StreamBatches(grpc::CallbackServerContext* ctx,
                                                                  v1::StreamSummary* resp) {
  return new BatchReader(ctx, manager_, auth_, resp);
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                                 const v1::WatchJobRequest* req) {
  return new EventWriter(ctx, manager_, auth_, *req);
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                                 v1::Job* resp) {
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) return Deny(ctx, st);
  return Reply(ctx, Guarded("GetJob", [&] { return manager_->Get(req->job_id()); }), resp);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx, const v1::ListJobsRequest* req,
                                                   v1::ListJobsResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) return Deny(ctx, st);
  return Reply(ctx, Guarded("ListJobs", [&] { return manager_->List(*req); }), resp);
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* ctx, const v1::CancelJobRequest* req,
                                                    v1::Job* resp) {
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) return Deny(ctx, st);
  return Reply(ctx, Guarded("CancelJob", [&] { return manager_->Cancel(req->job_id()); }), resp);
}

grpc::ServerUnaryReactor* JobServiceImpl::PauseJob(grpc::CallbackServerContext* ctx, const v1::PauseJobRequest* req,
                                                   v1::Job* resp) {
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) return Deny(ctx, st);
  return Reply(ctx, Guarded("PauseJob", [&] { return manager_->Pause(req->job_id()); }), resp);
}

grpc::ServerUnaryReactor* JobServiceImpl::ResumeJob(grpc::CallbackServerContext* ctx, const v1::ResumeJobRequest* req,
                                                    v1::Job* resp) {
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) return Deny(ctx, st);
  // A cluster job's resume asks its peers (seconds): off the callback thread, like every resume.
  auto* r = ctx->DefaultReactor();
  absl::Status queued = manager_->RunInBackground([this, r, req, resp] {
    auto out = Guarded("ResumeJob", [&] { return manager_->Resume(req->job_id(), req->nodes()); });
    if (out.ok()) *resp = std::move(*out);
    r->Finish(ToGrpcStatus(out.status()));
  });
  if (!queued.ok()) r->Finish(ToGrpcStatus(queued));
  return r;
}

grpc::ServerUnaryReactor* JobServiceImpl::Checkpoint(grpc::CallbackServerContext* ctx, const v1::CheckpointRequest* req,
                                                     v1::CheckpointResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) return Deny(ctx, st);
  // Waits for the job's next iteration boundary: off the callback thread.
  auto* r = ctx->DefaultReactor();
  absl::Status queued = manager_->RunInBackground([this, r, job = req->job_id(), resp] {
    auto result = Guarded("Checkpoint", [&] { return manager_->Checkpoint(job); });
    if (result.ok()) *resp = *result;
    r->Finish(ToGrpcStatus(result.status()));
  });
  if (!queued.ok()) r->Finish(ToGrpcStatus(queued));
  return r;
}

grpc::ServerUnaryReactor* JobServiceImpl::ExportModel(grpc::CallbackServerContext* ctx,
                                                      const v1::ExportModelRequest* req,
                                                      v1::ExportModelResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) return Deny(ctx, st);
  // Writing a model can take a while: off the callback thread.
  auto* r = ctx->DefaultReactor();
  absl::Status queued = manager_->RunInBackground([this, ctx, r, job = req->job_id(), dir = req->output_dir(),
                                                   merge = req->merge_lora(), resp] {
    // ctx lives until Finish: a client that gave up stops the export at the next tensor.
    auto path =
        Guarded("ExportModel", [&] { return manager_->Export(job, dir, merge, [ctx] { return ctx->IsCancelled(); }); });
    if (path.ok()) resp->set_path(*path);
    r->Finish(ToGrpcStatus(path.status()));
  });
  if (!queued.ok()) r->Finish(ToGrpcStatus(queued));
  return r;
}

grpc::ServerUnaryReactor* JobServiceImpl::Generate(grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req,
                                                   v1::GenerateResponse* resp) {
  if (grpc::Status st = auth_->Check(*ctx); !st.ok()) return Deny(ctx, st);
  // Loading the weights and generating take a while: off the callback thread.
  auto* r = ctx->DefaultReactor();
  absl::Status queued = manager_->RunInBackground([this, ctx, r, req, resp] {
    // ctx and req live until Finish: a client that gave up stops the generation at the next token.
    auto out = Guarded("Generate", [&] {
      return manager_->Generate(req->job_id(), req->sampling(), [ctx] { return ctx->IsCancelled(); });
    });
    if (out.ok()) *resp = std::move(*out);
    r->Finish(ToGrpcStatus(out.status()));
  });
  if (!queued.ok()) r->Finish(ToGrpcStatus(queued));
  return r;
}

}  // namespace rp::server
