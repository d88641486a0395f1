// job_samples.h — a job's sample generations (EvalPolicy::samples): its prompts checked at
// Submit, its tokenizer found when it starts, and at each evaluation the prompts encoded,
// completed through the job's own pipeline (runtime/generate.h) and decoded.
//
// Contract: CheckSamples and SampleTokenizerDir are pure; GenerateSamples runs on the job's
// runner thread between iterations (it drives the controller).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"
#include "scheduler/runtime/controller.h"
#include "workers/text/tokenizer.h"

namespace rp::scheduler::runtime {

// InvalidArgument naming the field ("eval.samples.prompts[2]: empty") for prompts or options a
// job cannot use (CheckSampleOptions); `has_validation`: samples run at evaluations, which need
// validation data (a generation job, Engine::Generate, passes true).
absl::Status CheckSamples(const EvalPolicy::Samples& s, bool has_validation);

// Where the job's sample tokenizer is: the data's tokenizer_dir, else the model's hf_dir; empty:
// none (byte-level: ids are bytes, needs a vocabulary of 256 or more; InvalidArgument otherwise).
absl::StatusOr<std::string> SampleTokenizerDir(const JobSpec& spec);

// One evaluation's samples: `tokenizer` null = byte-level. `stop` polled between tokens.
absl::StatusOr<std::vector<GeneratedSample>> GenerateSamples(Controller& c, const EvalPolicy::Samples& s,
                                                             const workers::text::Tokenizer* tokenizer,
                                                             int microbatches, const std::function<bool()>& stop);

}  // namespace rp::scheduler::runtime
