// libFuzzer target: the daemon's admission rules for a job (server/job_spec.cc and
// job_spec_optimizer.cc: ResolveJobSpec, every rule a JobSpec must satisfy before the engine sees
// it), coverage-guided, over any roundpipe.v1.JobSpec in protobuf text format. The spec's paths
// point into a small allowed root made at start ($RP_SPEC_FUZZ_ROOT: a token file, a JSONL file,
// a tokenizer dir, a model dir's config.json) and at places outside it. Whatever the spec, ResolveJobSpec returns a
// status; an accepted spec resolves to an engine spec within the documented bounds, with its output dir inside the root
// (or the default), and resolving it again gives the same result.
//
// ResolveJobSpec links the model's own checks (workers/spec) and the facade's LibTorch-free
// config.json reader (scheduler/hf_model_config.cc: a model.hf_dir's config.json is read for real) and one reader from
// behind the engine wall that needs LibTorch, PredictHostStateBytes: this target links the version in
// job_spec_fuzz_files.cc.
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "server/job_spec.h"

namespace {

std::string& Root() {
  static std::string root;
  return root;
}

rp::server::JobSpecContext Context() {
  rp::server::JobSpecContext ctx;
  ctx.daemon_devices = "cpu:2";
  ctx.num_devices = 2;
  ctx.allowed_roots = {Root()};
  ctx.default_output_dir = Root() + "/jobs/job-1";
  ctx.max_queued_batches = 8;
  ctx.host_memory_budget = [] { return int64_t{64} << 30; };
  ctx.max_message_bytes = 64 << 20;
  return ctx;
}

// Text-format errors are the fuzzer's daily bread: not logged.
class Quiet : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, google::protobuf::io::ColumnNumber, const std::string&) override {}
};

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  // run.sh names the root (its seed specs point into it); made afresh with the same files.
  const char* named = std::getenv("RP_SPEC_FUZZ_ROOT");
  Root() = named ? named : (fs::temp_directory_path() / ("rp_spec_fuzz_" + std::to_string(getpid()))).string();
  fs::create_directories(Root() + "/tok");
  std::ofstream(Root() + "/tokens.bin", std::ios::binary) << std::string(4096, '\x01');
  std::ofstream(Root() + "/train.jsonl") << "{\"text\": \"ab ab\"}\n";
  fs::create_directories(Root() + "/hf");
  std::ofstream(Root() + "/hf/config.json")
      << R"({"model_type": "qwen3", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,)"
      << R"( "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16})";
  std::ofstream(Root() + "/tok/tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, " ": 2}, "merges": []}})";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  roundpipe::v1::JobSpec spec;
  google::protobuf::TextFormat::Parser parser;
  Quiet quiet;
  parser.RecordErrorsTo(&quiet);
  parser.AllowPartialMessage(true);
  if (!parser.ParseFromString(std::string(reinterpret_cast<const char*>(data), size), &spec)) return 0;
  const rp::server::JobSpecContext ctx = Context();
  auto r = rp::server::ResolveJobSpec(spec, ctx);
  static const bool verbose = std::getenv("RP_SPEC_FUZZ_VERBOSE") != nullptr;  // replaying seeds by hand
  if (verbose) std::fprintf(stderr, "ResolveJobSpec: %s\n", r.ok() ? "OK" : r.status().ToString().c_str());
  if (!r.ok()) {
    Check(!r.status().message().empty());
    return 0;
  }
  const rp::scheduler::JobSpec& e = r->engine;
  Check(!e.name.empty() && e.name.size() <= 200);
  Check(e.model.vocab > 0 && e.model.vocab <= (int64_t{1} << 24));
  Check(e.model.num_blocks >= 1 && e.model.num_blocks <= 1024);
  Check(e.model.hidden > 0 && e.model.hidden <= (int64_t{1} << 16));
  Check(r->global_batch >= 1 && r->global_batch <= (int64_t{1} << 20));
  Check(r->sequence_length >= 1);
  Check(std::isfinite(e.optimizer.lr) && e.optimizer.lr >= 0 && e.optimizer.lr <= 1);
  Check(r->output_dir == ctx.default_output_dir || absl::StartsWith(r->output_dir, Root() + "/"));
  auto again = rp::server::ResolveJobSpec(spec, ctx);
  Check(again.ok() && again->output_dir == r->output_dir && again->global_batch == r->global_batch &&
        again->engine.name == e.name);
  return 0;
}
