// job_service.h — roundpipe.v1.JobService on the gRPC callback API. Handlers authenticate,
// delegate to the JobManager (which never blocks on training) and map its Status through
// ToGrpcStatus. StreamBatches reads one message at a time and asks for the next only once the
// previous batch sits in the job's bounded queue: that is the backpressure.
//
// Contract: the service and the JobManager/Authenticator it points to outlive the grpc::Server.
#pragma once

#include "roundpipe/v1/jobs.grpc.pb.h"
#include "server/auth.h"
#include "server/job_manager.h"

namespace rp::server {

class JobServiceImpl final : public roundpipe::v1::JobService::CallbackService {
 public:
  JobServiceImpl(JobManager* manager, const Authenticator* auth) : manager_(manager), auth_(auth) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* ctx, const roundpipe::v1::SubmitJobRequest* req,
                                      roundpipe::v1::Job* resp) override;
  grpc::ServerReadReactor<roundpipe::v1::Batch>* StreamBatches(grpc::CallbackServerContext* ctx,
                                                               roundpipe::v1::StreamSummary* resp) override;
  grpc::ServerWriteReactor<roundpipe::v1::JobEvent>* WatchJob(grpc::CallbackServerContext* ctx,
                                                              const roundpipe::v1::WatchJobRequest* req) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const roundpipe::v1::GetJobRequest* req,
                                   roundpipe::v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx, const roundpipe::v1::ListJobsRequest* req,
                                     roundpipe::v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx, const roundpipe::v1::CancelJobRequest* req,
                                      roundpipe::v1::Job* resp) override;
  grpc::ServerUnaryReactor* PauseJob(grpc::CallbackServerContext* ctx, const roundpipe::v1::PauseJobRequest* req,
                                     roundpipe::v1::Job* resp) override;
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* ctx, const roundpipe::v1::ResumeJobRequest* req,
                                      roundpipe::v1::Job* resp) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx, const roundpipe::v1::CheckpointRequest* req,
                                       roundpipe::v1::CheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* ExportModel(grpc::CallbackServerContext* ctx, const roundpipe::v1::ExportModelRequest* req,
                                        roundpipe::v1::ExportModelResponse* resp) override;
  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* ctx, const roundpipe::v1::GenerateRequest* req,
                                     roundpipe::v1::GenerateResponse* resp) override;

 private:
  JobManager* manager_;
  const Authenticator* auth_;
};

}  // namespace rp::server
