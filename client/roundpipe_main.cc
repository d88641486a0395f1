// roundpipe — the command-line client of roundpiped. See `roundpipe --help`.
#include <google/protobuf/util/json_util.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "client/client.h"
#include "client/watch_view.h"

ABSL_FLAG(std::string, address, "",
          "daemon address host:port or unix:PATH (default $ROUNDPIPE_ADDRESS or 127.0.0.1:50151)");
ABSL_FLAG(std::string, token_file, "", "file holding a bearer token (default: $ROUNDPIPE_TOKEN if set)");
ABSL_FLAG(std::string, tls_ca, "", "CA certificate: connect with TLS and verify the daemon against it");
ABSL_FLAG(std::string, tls_cert, "", "client certificate (daemons that require one)");
ABSL_FLAG(std::string, tls_key, "", "client certificate key");
ABSL_FLAG(bool, watch, false, "submit: watch the job until it ends");
ABSL_FLAG(bool, keep_open, false, "stream: leave the job's input open after this stream");
ABSL_FLAG(int, batch, 0, "stream: sequences per batch (default: the job's global_batch)");
ABSL_FLAG(int, seq, 0, "stream: tokens per sequence (default: the job's sequence_length)");
ABSL_FLAG(std::string, out, "", "export: output directory (inside the daemon's allowed roots); tokenize: output file");
ABSL_FLAG(std::string, state, "",
          "ls: only jobs in this state (queued, running, paused, succeeded, failed, cancelled)");
ABSL_FLAG(bool, json, false, "get/ls/info/samples/generate: print JSON");
ABSL_FLAG(std::string, prompt, "", "generate: a prompt (more may follow the job id as arguments)");
ABSL_FLAG(std::string, sampling_file, "",
          "generate: a SamplePolicy in JSON ({\"prompts\": [...], ...}; e.g. from roundpipe_client.py chat-prompts); "
          "--prompt and arguments add prompts, the other flags override it when set");
ABSL_FLAG(int, nodes, 0,
          "resume: a cluster job that failed or was cancelled resumes on this many nodes (default: as before)");
ABSL_FLAG(int, max_new_tokens, 0, "generate: tokens to generate per prompt, 1 to 1024 (default: the file's, else 32)");
ABSL_FLAG(double, temperature, 0,
          "generate: > 0 samples softmax(logits / temperature) (default: the file's, else greedy)");
ABSL_FLAG(uint64_t, seed, 0, "generate: the sampling seed (default: the file's, else 0)");
ABSL_FLAG(bool, merge_lora, false, "export: LoRA jobs export merged full weights instead of the PEFT adapter");
ABSL_FLAG(bool, now, false, "worker drain: at once (the worker's stage slots are re-run on the others)");

namespace v1 = roundpipe::v1;

namespace {

// Exit codes scripts can rely on.
constexpr int kOk = 0;           // done (watch: the job SUCCEEDED)
constexpr int kJobNotOk = 1;     // watch/submit --watch: the job FAILED or was CANCELLED
constexpr int kUsage = 2;        // bad command line or local input
constexpr int kRejected = 3;     // the daemon refused the request (message on stderr)
constexpr int kUnreachable = 4;  // no daemon at the address, or it went away

const char kUsageText[] =
    "roundpipe: command-line client of the roundpiped training daemon.\n"
    "\n"
    "usage: roundpipe [flags] COMMAND [ARGS]\n"
    "  submit SPEC.json [--watch]    submit a job (JSON mapped onto roundpipe.v1.JobSpec); prints its id\n"
    "  stream JOB FILE...            stream byte-level tokens of FILEs (text) to a job with streamed data\n"
    "                                [--batch B --seq S] [--keep_open]\n"
    "  samples JOB [--json]          the latest evaluation's sample generations (eval.samples)\n"
    "  generate JOB --prompt TEXT [PROMPT...]  complete prompts with a finished job's final weights\n"
    "                                [--sampling_file F.json] [--max_new_tokens N] [--temperature T\n"
    "                                --seed S] [--json]\n"
    "  watch JOB                     live progress until the job ends: in a terminal a loss curve above\n"
    "                                the progress line (step, loss, tokens/s, ETA); plain lines otherwise\n"
    "  ls [--state S]                list jobs\n"
    "  get JOB                       one job (--json for everything)\n"
    "  cancel|pause|resume JOB       control a job\n"
    "  checkpoint JOB                take a training checkpoint\n"
    "  export JOB [--out DIR]        write the job's weights as a Hugging Face model directory\n"
    "                                (LoRA jobs: a PEFT adapter dir; --merge_lora: merged weights)\n"
    "  profile JOB                   where the job's measured per-layer profile is (roundpipe-sim --profile);\n"
    "                                the file's content when this machine can read it\n"
    "  info                          devices, memory and versions of the daemon\n"
    "  drain                         stop admitting jobs and pause running ones\n"
    "  worker drain|enable ID        take worker ID (see info) out of the pool or put it back; drain\n"
    "                                [--now]: at once, its stage slots re-run on the other workers\n"
    "  tokenize --out F.bin FILE...  (local) byte-level uint16 tokens of FILEs, for a token_file job\n"
    "\n"
    "exit codes: 0 ok; 1 the watched job failed or was cancelled; 2 usage error; 3 the daemon refused\n"
    "the request; 4 the daemon is unreachable.\n"
    "environment: ROUNDPIPE_ADDRESS, ROUNDPIPE_TOKEN.";

int Report(const absl::Status& st) {
  std::fprintf(stderr, "roundpipe: %s: %s\n", absl::StatusCodeToString(st.code()).c_str(),
               std::string(st.message()).c_str());
  return st.code() == absl::StatusCode::kUnavailable || st.code() == absl::StatusCode::kDeadlineExceeded ? kUnreachable
                                                                                                         : kRejected;
}

int Usage(const std::string& msg) {
  std::fprintf(stderr, "roundpipe: %s\n(see roundpipe --help)\n", msg.c_str());
  return kUsage;
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string StateName(v1::JobState s) {
  std::string n = v1::JobState_Name(s);
  return n.rfind("JOB_STATE_", 0) == 0 ? n.substr(10) : n;
}

absl::StatusOr<std::vector<int32_t>> ByteTokens(const std::vector<std::string>& files) {
  std::vector<int32_t> tokens;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", f, "'"));
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (unsigned char c : bytes) tokens.push_back(c);
  }
  return tokens;
}

// Prints progress until the job ends (client/watch_view.h); returns the exit code.
int WatchJob(rp::client::Client& c, const std::string& id) {
  rp::client::WatchViewOptions o;
  o.terminal = isatty(fileno(stdout)) != 0;
  winsize ws{};
  if (o.terminal && ioctl(fileno(stdout), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) o.columns = ws.ws_col;
  if (auto j = c.Get(id); j.ok()) o.total_steps = j->total_steps();
  if (auto info = c.Info(); info.ok()) {
    o.cpu_workers = info->devices_size() > 0;
    for (const auto& d : info->devices()) o.cpu_workers = o.cpu_workers && absl::StartsWith(d.name(), "cpu");
  }
  rp::client::WatchView view(id, stdout, o);
  absl::Status st = c.Watch(id, [&](const v1::JobEvent& e) { view.OnEvent(e); });
  view.Finish();
  if (!st.ok()) return Report(st);
  return view.final_state() == v1::JOB_STATE_SUCCEEDED ? kOk : kJobNotOk;
}

using Args = std::vector<std::string>;  // the command and its operands

int CmdTokenize(const Args& args) {
  if (absl::GetFlag(FLAGS_out).empty() || args.size() < 2) return Usage("tokenize: --out FILE.bin and input files");
  auto tokens = ByteTokens({args.begin() + 1, args.end()});
  if (!tokens.ok()) return Usage(std::string(tokens.status().message()));
  std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::binary);
  for (int32_t t : *tokens) {
    const unsigned char le[2] = {static_cast<unsigned char>(t & 0xff), static_cast<unsigned char>(t >> 8)};
    out.write(reinterpret_cast<const char*>(le), 2);
  }
  if (!out) return Usage(absl::StrCat("cannot write ", absl::GetFlag(FLAGS_out)));
  std::printf("%zu tokens -> %s\n", tokens->size(), absl::GetFlag(FLAGS_out).c_str());
  return kOk;
}

// --address / ROUNDPIPE_ADDRESS, --token_file / ROUNDPIPE_TOKEN, the TLS flags.
absl::StatusOr<rp::client::ClientOptions> ClientOptionsFromFlags() {
  rp::client::ClientOptions o;
  o.address = absl::GetFlag(FLAGS_address);
  if (o.address.empty())
    o.address = std::getenv("ROUNDPIPE_ADDRESS") ? std::getenv("ROUNDPIPE_ADDRESS") : "127.0.0.1:50151";
  if (!absl::GetFlag(FLAGS_token_file).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_token_file));
    if (!in || !std::getline(in, o.token)) return absl::InvalidArgumentError("cannot read --token_file");
  } else if (std::getenv("ROUNDPIPE_TOKEN")) {
    o.token = std::getenv("ROUNDPIPE_TOKEN");
  }
  o.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  return o;
}

int CmdSubmit(rp::client::Client& c, const Args& args) {
  if (args.size() != 2) return Usage("submit: one job spec file");
  auto spec = rp::client::LoadJobSpecFile(args[1]);
  if (!spec.ok()) return Usage(std::string(spec.status().message()));
  auto job = c.Submit(*spec);
  if (!job.ok()) return Report(job.status());
  std::printf("%s\n", job->id().c_str());
  std::fflush(stdout);
  return absl::GetFlag(FLAGS_watch) ? WatchJob(c, job->id()) : kOk;
}

int CmdStream(rp::client::Client& c, const Args& args) {
  if (args.size() < 3) return Usage("stream: JOB and at least one file");
  auto job = c.Get(args[1]);
  if (!job.ok()) return Report(job.status());
  int batch = absl::GetFlag(FLAGS_batch), seq = absl::GetFlag(FLAGS_seq);
  if (batch == 0) batch = job->spec().batching().global_batch();
  if (seq == 0) seq = job->spec().batching().sequence_length();
  if (batch <= 0 || seq <= 0) return Usage("stream: give --batch and --seq (the job spec leaves them to defaults)");
  auto tokens = ByteTokens({args.begin() + 2, args.end()});
  if (!tokens.ok()) return Usage(std::string(tokens.status().message()));
  auto summary = c.StreamTokens(args[1], *tokens, batch, seq, absl::GetFlag(FLAGS_keep_open));
  if (!summary.ok()) return Report(summary.status());
  std::printf("%lld batches accepted (%s)\n", static_cast<long long>(summary->accepted()), summary->message().c_str());
  return kOk;
}

int CmdList(rp::client::Client& c, const Args&) {
  std::vector<v1::JobState> states;
  if (!absl::GetFlag(FLAGS_state).empty()) {
    std::string s = "JOB_STATE_" + absl::GetFlag(FLAGS_state);
    for (auto& ch : s) ch = static_cast<char>(std::toupper(ch));
    v1::JobState st;
    if (!v1::JobState_Parse(s, &st)) return Usage("--state: queued, running, paused, succeeded, failed or cancelled");
    states.push_back(st);
  }
  auto jobs = c.List(states);
  if (!jobs.ok()) return Report(jobs.status());
  if (absl::GetFlag(FLAGS_json)) {
    for (const auto& j : *jobs) std::printf("%s", Json(j).c_str());
    return kOk;
  }
  std::printf("%-12s %-10s %-20s %8s %10s  %s\n", "ID", "STATE", "NAME", "STEP", "LOSS", "DETAIL");
  for (const auto& j : *jobs) {
    std::printf("%-12s %-10s %-20s %8lld %10.4f  %s\n", j.id().c_str(), StateName(j.state()).c_str(),
                j.spec().name().substr(0, 20).c_str(), static_cast<long long>(j.progress().step()),
                j.progress().last_loss(), (j.error().empty() ? j.message() : j.error()).c_str());
  }
  return kOk;
}

int CmdGet(rp::client::Client& c, const Args& args) {
  if (args.size() != 2) return Usage("get: one job id");
  auto j = c.Get(args[1]);
  if (!j.ok()) return Report(j.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s", Json(*j).c_str());
    return kOk;
  }
  const std::string eval = j->has_last_eval() ? absl::StrFormat("  eval %.4f (best %.4f at step %lld)",
                                                                j->last_eval().loss(), j->last_eval().best_loss(),
                                                                static_cast<long long>(j->last_eval().best_step()))
                                              : "";
  std::printf("%s  %s  step %lld/%lld  loss %.4f%s  tokens %lld  partition %s%s%s\n", j->id().c_str(),
              StateName(j->state()).c_str(), static_cast<long long>(j->progress().step()),
              static_cast<long long>(j->total_steps()), j->progress().last_loss(), eval.c_str(),
              static_cast<long long>(j->progress().tokens()), j->partition().c_str(),
              j->error().empty() && j->message().empty() ? "" : "  ",
              (j->error().empty() ? j->message() : j->error()).c_str());
  // A cluster job: one line per node as this daemon last saw it.
  for (const auto& n : j->cluster().nodes()) {
    const auto& p = n.progress();
    std::printf(
        "  node %d '%s' (%s, job %s)  %s  step %lld  tokens/s %.0f  bubble %.3f  collectives %.2f s, %.1f MiB"
        "  peak host state %.1f MiB%s%s\n",
        n.rank(), n.node().c_str(), n.address().c_str(), n.job_id().c_str(), StateName(n.state()).c_str(),
        static_cast<long long>(n.step()), p.tokens_per_second(), p.last_bubble_ratio(), p.collective_seconds(),
        static_cast<double>(p.collective_bytes()) / (1 << 20),
        static_cast<double>(n.host_memory().peak_state_bytes()) / (1 << 20), n.message().empty() ? "" : "  ",
        n.message().c_str());
  }
  return kOk;
}

int CmdControl(rp::client::Client& c, const Args& args) {  // cancel, pause, resume
  const std::string& cmd = args[0];
  if (args.size() != 2) return Usage(cmd + ": one job id");
  auto j = cmd == "cancel"  ? c.Cancel(args[1])
           : cmd == "pause" ? c.Pause(args[1])
                            : c.Resume(args[1], absl::GetFlag(FLAGS_nodes));
  if (!j.ok()) return Report(j.status());
  std::printf("%s: %s requested (now %s)\n", j->id().c_str(), cmd.c_str(), StateName(j->state()).c_str());
  return kOk;
}

int CmdCheckpoint(rp::client::Client& c, const Args& args) {
  if (args.size() != 2) return Usage("checkpoint: one job id");
  auto r = c.Checkpoint(args[1]);
  if (!r.ok()) return Report(r.status());
  std::printf("checkpoint at step %lld: %s\n", static_cast<long long>(r->step()), r->path().c_str());
  return kOk;
}

int CmdExport(rp::client::Client& c, const Args& args) {
  if (args.size() != 2) return Usage("export: one job id");
  auto path = c.Export(args[1], absl::GetFlag(FLAGS_out), absl::GetFlag(FLAGS_merge_lora));
  if (!path.ok()) return Report(path.status());
  std::printf("%s\n", path->c_str());
  return kOk;
}

int CmdInfo(rp::client::Client& c, const Args&) {
  auto info = c.Info();
  if (!info.ok()) return Report(info.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s", Json(*info).c_str());
    return kOk;
  }
  std::printf("roundpiped %s (torch %s, grpc %s), cpu AdamW path %s, %d active job(s)%s\n",
              info->build().roundpipe_version().c_str(), info->build().torch_version().c_str(),
              info->build().grpc_version().c_str(), info->cpu_adamw_path().c_str(), info->jobs_active(),
              info->draining() ? ", draining" : "");
  std::printf("host memory %.1f GiB\n", static_cast<double>(info->host_memory_bytes()) / (1 << 30));
  for (const auto& d : info->devices()) {
    std::printf("  %d %-8s %-7s %s%s%s\n", d.worker(), d.name().c_str(), d.state().c_str(), d.description().c_str(),
                d.lost_reason().empty() ? "" : ": ", d.lost_reason().c_str());
  }
  if (info->has_cluster()) {
    std::printf("cluster node '%s' at %s, %d member(s):\n", info->cluster().node().c_str(),
                info->cluster().address().c_str(), info->cluster().members_size());
    for (const auto& m : info->cluster().members()) {
      if (!m.reachable()) {
        std::printf("  %-21s unreachable: %s\n", m.address().c_str(), m.error().c_str());
        continue;
      }
      std::printf("  %-21s '%s': %d device(s), host memory %.1f GiB, %d active job(s)\n", m.address().c_str(),
                  m.node().c_str(), m.devices_size(), static_cast<double>(m.host_memory_bytes()) / (1 << 30),
                  m.jobs_active());
      for (const auto& d : m.devices()) {
        std::printf("    %d %-8s %-7s %s\n", d.worker(), d.name().c_str(), d.state().c_str(), d.description().c_str());
      }
    }
  }
  std::printf("running %d of at most %d job(s)\n", info->running_jobs_size(), info->max_running_jobs());
  for (const auto& j : info->running_jobs()) {
    std::string per_worker;
    for (int w = 0; w < j.worker_compute_seconds_size(); ++w) {
      absl::StrAppend(&per_worker, w == 0 ? "" : ", ", "worker ", w, " ",
                      absl::StrFormat("%.1f", j.worker_compute_seconds(w)), " s");
    }
    std::printf("  %s share %g: compute %.1f s (%s)\n", j.job_id().c_str(), j.share(), j.compute_seconds(),
                per_worker.c_str());
  }
  return kOk;
}

int CmdDrain(rp::client::Client& c, const Args&) {
  auto n = c.Drain();
  if (!n.ok()) return Report(n.status());
  std::printf("draining: %d job(s) paused\n", *n);
  return kOk;
}

int CmdWorker(rp::client::Client& c, const Args& args) {
  int worker = -1;
  if (args.size() != 3 || (args[1] != "drain" && args[1] != "enable") || !absl::SimpleAtoi(args[2], &worker)) {
    return Usage("worker: drain|enable and a worker index (roundpipe info lists them)");
  }
  const bool now = absl::GetFlag(FLAGS_now);
  if (now && args[1] != "drain") return Usage("worker: --now applies to drain only");
  auto d = args[1] == "drain" ? c.DrainWorker(worker, now) : c.EnableWorker(worker);
  if (!d.ok()) return Report(d.status());
  std::printf("worker %d (%s): %s%s%s\n", d->worker(), d->name().c_str(), d->state().c_str(),
              d->lost_reason().empty() ? "" : ": ", d->lost_reason().c_str());
  return kOk;
}

// The measured profile: its path on the daemon's machine, and its JSON when readable from here
// (the same machine, or a shared file system).
void PrintSamples(const google::protobuf::RepeatedPtrField<v1::Sample>& samples) {
  for (const v1::Sample& s : samples) {
    std::printf("--- prompt\n%s\n--- completion (%d tokens)\n%s\n", s.prompt().c_str(), s.token_ids_size(),
                s.completion().c_str());
  }
}

// The latest evaluation's sample generations (GetJob's last_eval).
int CmdSamples(rp::client::Client& c, const Args& args) {
  if (args.size() != 2) return Usage("samples: one job id");
  auto j = c.Get(args[1]);
  if (!j.ok()) return Report(j.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(j->last_eval()).c_str());
    return kOk;
  }
  if (j->last_eval().samples().empty()) {
    return Report(absl::FailedPreconditionError(absl::StrCat(
        "job ", j->id(), " has no sample generations yet (eval.samples in its spec; they come with each evaluation)")));
  }
  std::printf("samples at step %lld (eval loss %.4f):\n", static_cast<long long>(j->last_eval().step()),
              j->last_eval().loss());
  PrintSamples(j->last_eval().samples());
  return kOk;
}

// Completions from a finished job's final weights (JobService.Generate).
int CmdGenerate(rp::client::Client& c, const Args& args) {
  if (args.size() < 2) return Usage("generate: a job id, then --prompt TEXT (or prompts as arguments)");
  v1::SamplePolicy sampling;
  if (const std::string file = absl::GetFlag(FLAGS_sampling_file); !file.empty()) {
    auto loaded = rp::client::LoadSamplingFile(file);
    if (!loaded.ok()) return Usage(absl::StrCat("--sampling_file: ", loaded.status().message()));
    sampling = *loaded;
  }
  if (!absl::GetFlag(FLAGS_prompt).empty()) sampling.add_prompts(absl::GetFlag(FLAGS_prompt));
  for (size_t i = 2; i < args.size(); ++i) sampling.add_prompts(args[i]);
  if (sampling.prompts().empty()) return Usage("generate: give a prompt (--prompt TEXT or --sampling_file F)");
  if (absl::GetFlag(FLAGS_max_new_tokens) != 0) sampling.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  if (absl::GetFlag(FLAGS_temperature) != 0) sampling.set_temperature(absl::GetFlag(FLAGS_temperature));
  if (absl::GetFlag(FLAGS_seed) != 0) sampling.set_seed(absl::GetFlag(FLAGS_seed));
  auto r = c.Generate(args[1], sampling);
  if (!r.ok()) return Report(r.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", Json(*r).c_str());
    return kOk;
  }
  std::printf("from step %lld (%s), %.1f s:\n", static_cast<long long>(r->step()), r->checkpoint().c_str(),
              r->seconds());
  PrintSamples(r->samples());
  return kOk;
}

int CmdProfile(rp::client::Client& c, const Args& args) {
  if (args.size() != 2) return Usage("profile: one job id");
  auto j = c.Get(args[1]);
  if (!j.ok()) return Report(j.status());
  if (j->profile().empty()) {
    return Report(absl::FailedPreconditionError(
        absl::StrCat("job ", j->id(), " has no measured profile (jobs with an automatic partition write one ",
                     "once their profiling iterations ran)")));
  }
  std::ifstream in(j->profile());
  if (!in) {
    std::printf("%s\n", j->profile().c_str());
    std::fprintf(stderr, "roundpipe: %s is on the daemon's machine (not readable here)\n", j->profile().c_str());
    return kOk;
  }
  std::printf("%s", std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()).c_str());
  std::fprintf(stderr, "roundpipe: %s; replay it: roundpipe-sim --profile %s\n", j->profile().c_str(),
               j->profile().c_str());
  return kOk;
}

int CmdWatch(rp::client::Client& c, const Args& args) {
  if (args.size() != 2) return Usage("watch: one job id");
  return WatchJob(c, args[1]);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsageText);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  const Args args(rest.begin() + 1, rest.end());
  if (args.empty()) return Usage("no command given");
  if (args[0] == "tokenize") return CmdTokenize(args);  // local: no daemon needed

  using Command = int (*)(rp::client::Client&, const Args&);
  static const std::map<std::string, Command> kCommands = {
      {"submit", CmdSubmit},   {"stream", CmdStream},         {"watch", CmdWatch},     {"ls", CmdList},
      {"get", CmdGet},         {"cancel", CmdControl},        {"pause", CmdControl},   {"resume", CmdControl},
      {"export", CmdExport},   {"checkpoint", CmdCheckpoint}, {"info", CmdInfo},       {"drain", CmdDrain},
      {"profile", CmdProfile}, {"worker", CmdWorker},         {"samples", CmdSamples}, {"generate", CmdGenerate}};
  auto command = kCommands.find(args[0]);
  if (command == kCommands.end()) return Usage(absl::StrCat("unknown command '", args[0], "'"));
  auto options = ClientOptionsFromFlags();
  if (!options.ok()) return Usage(std::string(options.status().message()));
  auto client = rp::client::Client::Connect(*options);
  if (!client.ok()) return Usage(std::string(client.status().message()));
  return command->second(**client, args);
}
