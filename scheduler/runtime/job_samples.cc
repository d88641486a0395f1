// A job's sample generations (job_samples.h).
#include "scheduler/runtime/job_samples.h"

#include "absl/strings/str_cat.h"
#include "scheduler/runtime/generate.h"
#include "workers/text/byte_level.h"

namespace rp::scheduler::runtime {

absl::Status CheckSamples(const EvalPolicy::Samples& s, bool has_validation) {
  if (s.prompts.empty()) return absl::OkStatus();
  if (!has_validation) {
    return absl::InvalidArgumentError(
        "eval.samples: samples are generated at evaluations, which need a validation source (data.validation)");
  }
  return CheckSampleOptions(s, "eval.samples");
}

absl::StatusOr<std::string> SampleTokenizerDir(const JobSpec& spec) {
  if (spec.token_file && !spec.token_file->tokenizer_dir.empty()) return spec.token_file->tokenizer_dir;
  if (!spec.hf_dir.empty()) return spec.hf_dir;
  if (spec.model.vocab < 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval.samples: no tokenizer (set data.token_file.tokenizer_dir or model.hf_dir); byte-level prompts need a "
        "vocabulary of 256 or more, the model has ",
        spec.model.vocab));
  }
  return std::string();
}

absl::StatusOr<std::vector<GeneratedSample>> GenerateSamples(Controller& c, const EvalPolicy::Samples& s,
                                                             const workers::text::Tokenizer* tokenizer,
                                                             int microbatches, const std::function<bool()>& stop) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : s.prompts) {
    if (tokenizer != nullptr) {
      prompts.push_back(tokenizer->Encode(p));
    } else {
      prompts.emplace_back(p.begin(), p.end());
      for (int32_t& id : prompts.back()) id = static_cast<unsigned char>(id);
    }
    if (prompts.back().empty()) prompts.back().push_back(0);  // a prompt the tokenizer maps to nothing
  }
  GenerateOptions o;
  o.max_new_tokens = s.max_new_tokens;
  o.temperature = s.temperature;
  o.seed = s.seed;
  auto ids = Generate(c, prompts, o, microbatches, stop);
  if (!ids.ok()) return ids.status();
  std::vector<GeneratedSample> out;
  for (size_t i = 0; i < s.prompts.size(); ++i) {
    GeneratedSample g;
    g.prompt = s.prompts[i];
    g.token_ids = (*ids)[i];
    if (tokenizer != nullptr) {
      g.completion = tokenizer->Decode(g.token_ids);
    } else {
      std::string bytes;
      for (int32_t id : g.token_ids) bytes += id >= 0 && id < 256 ? static_cast<char>(id) : '?';
      g.completion = workers::text::Utf8Lossy(bytes);  // what a text field may hold
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace rp::scheduler::runtime
