// A structured fuzzer of the job-spec surface, in-process: JobSpecs mutated field by field through
// protobuf reflection (sizes at and beyond the limits, negatives, NaN/inf, huge and hostile
// strings, unknown enum values) go through ResolveJobSpec — the daemon's admission rules — as
// serialized bytes and as JSON. It must never throw or crash, and every spec it accepts must hold
// the engine's invariants (finite, bounded, valid model, no overflow in the sizes it derives).
// Then the same through a real JobManager (specs admitted, batches fed). RP_SPEC_FUZZ_ITERATIONS
// sets the count (default 4000 specs, a tenth of that through the manager, at most 3000;
// tests/bench/fuzz_soak.sh runs longer).
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include "prometheus/registry.h"
#include "scheduler/engine.h"
#include "scheduler/planning/host_state.h"
#include "server/job_manager.h"
#include "server/job_spec.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "tests/support/tiny_spec.h"

namespace rp::server {
namespace {
namespace fs = std::filesystem;
namespace v1 = roundpipe::v1;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

class Mutator {
 public:
  Mutator(uint64_t seed, std::string root) : gen_(seed), root_(std::move(root)) {}

  void Mutate(Message* m, int depth = 0) {
    const auto* d = m->GetDescriptor();
    const Reflection* r = m->GetReflection();
    if (d->field_count() == 0) return;
    const FieldDescriptor* f = d->field(Pick(d->field_count()));
    if (f->is_repeated()) {
      if (Pick(4) == 0) {
        r->ClearField(m, f);
        return;
      }
      const int n = Pick(4);
      for (int i = 0; i < n; ++i) AddRepeated(m, f, depth);
      return;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(m, f, static_cast<int32_t>(Int()));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(m, f, Int());
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(m, f, static_cast<uint32_t>(Int()));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(m, f, static_cast<uint64_t>(Int()));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(m, f, Real());
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(m, f, static_cast<float>(Real()));
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(m, f, Pick(2) == 0);
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnumValue(m, f, Pick(3) == 0 ? static_cast<int>(Int()) : Pick(f->enum_type()->value_count() + 1));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(m, f, Text());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < 4) Mutate(r->MutableMessage(m, f), depth + 1);
        break;
    }
  }

 private:
  int Pick(int n) { return static_cast<int>(gen_() % static_cast<uint64_t>(n)); }
  int64_t Int() {
    static const int64_t kEdges[] = {0,        1,         -1,        2,         3,         4,         7,
                                     8,        16,        64,        255,       256,       1000,      1 << 20,
                                     1 << 24,  INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, 1LL << 32, (1LL << 32) + 4,
                                     1LL << 57};
    if (Pick(3) == 0) return static_cast<int64_t>(gen_());
    return kEdges[Pick(static_cast<int>(std::size(kEdges)))];
  }
  double Real() {
    const double kEdges[] = {0,
                             1e-8,
                             1e-4,
                             0.5,
                             0.9,
                             0.999,
                             1,
                             1.5,
                             -1,
                             1e6,
                             1e300,
                             -1e300,
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::denorm_min()};
    if (Pick(4) == 0) return std::uniform_real_distribution<double>(-10, 10)(gen_);
    return kEdges[Pick(static_cast<int>(std::size(kEdges)))];
  }
  std::string Text() {
    switch (Pick(10)) {
      case 0:
        return "";
      case 1:
        return "llama-tiny";
      case 2:
        return "qwen3-tiny";
      case 3:
        return "auto";
      case 4:
        return root_ + "/" + std::to_string(Pick(3));
      case 5:
        return "/etc/passwd";
      case 6:
        return root_ + "/../..";
      case 7:
        return std::string(static_cast<size_t>(Pick(20000)), 'x');
      case 8:
        return "q_proj";
      default: {
        std::string s(static_cast<size_t>(Pick(12)), ' ');
        for (auto& c : s) c = static_cast<char>(Pick(256));
        return s;
      }
    }
  }
  void AddRepeated(Message* m, const FieldDescriptor* f, int depth) {
    const Reflection* r = m->GetReflection();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->AddInt32(m, f, static_cast<int32_t>(Int()));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->AddInt64(m, f, Int());
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->AddDouble(m, f, Real());
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->AddFloat(m, f, static_cast<float>(Real()));
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->AddString(m, f, Text());
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->AddEnumValue(m, f, Pick(f->enum_type()->value_count()));
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < 4) Mutate(r->AddMessage(m, f), depth + 1);
        break;
      default:
        break;
    }
  }
  std::mt19937_64 gen_;
  std::string root_;
};

void CheckAccepted(const ResolvedJob& r, const v1::JobSpec& spec) {
  const auto& e = r.engine;
  ASSERT_TRUE(e.model.Validate().ok()) << spec.DebugString();
  EXPECT_TRUE(std::isfinite(e.optimizer.lr) && e.optimizer.lr > 0 && e.optimizer.lr <= 1) << e.optimizer.lr;
  EXPECT_TRUE(std::isfinite(e.optimizer.eps) && std::isfinite(e.optimizer.weight_decay) &&
              std::isfinite(e.optimizer.max_grad_norm));
  EXPECT_GE(e.microbatches, 1);
  EXPECT_GE(r.global_batch, 1);
  EXPECT_GE(r.sequence_length, 1);
  EXPECT_LE(r.global_batch * r.sequence_length, int64_t{1} << 28);
  EXPECT_EQ(r.global_batch % e.microbatches, 0);
  EXPECT_GE(planning::HostStateBytes(e.model, {.master_bytes = 4}), 0);
  EXPECT_GE(e.checkpoint_every, 0);
  EXPECT_GE(e.max_steps, 0);
}

TEST(SpecFuzz, AdmissionNeverCrashesAndAcceptsOnlySaneSpecs) {
  const fs::path root = fs::temp_directory_path() / ("rp_spec_fuzz_" + std::to_string(getpid()));
  fs::create_directories(root);
  JobSpecContext ctx;
  ctx.daemon_devices = "cpu:2";
  ctx.num_devices = 2;
  ctx.allowed_roots = {root.string()};
  ctx.default_output_dir = (root / "out").string();
  ctx.max_message_bytes = 64 << 20;
  ctx.host_memory_budget = [] { return int64_t{16} << 30; };
  const char* env = std::getenv("RP_SPEC_FUZZ_ITERATIONS");
  const int iterations = env ? std::atoi(env) : 4000;
  int accepted = 0;
  for (int i = 0; i < iterations; ++i) {
    Mutator mut(static_cast<uint64_t>(i) * 7919 + 1, root.string());
    v1::JobSpec spec;
    spec.mutable_model()->set_preset("llama-tiny");
    spec.mutable_batching()->set_global_batch(4);
    spec.mutable_batching()->set_sequence_length(16);
    const int mutations = 1 + i % 6;
    for (int k = 0; k < mutations; ++k) mut.Mutate(&spec);
    // The wire and JSON forms must round-trip into the same rules (the daemon sees both).
    v1::JobSpec wire;
    if (!wire.ParseFromString(spec.SerializeAsString())) continue;  // e.g. non-UTF-8 strings: gRPC refuses them
    absl::StatusOr<ResolvedJob> r = [&]() -> absl::StatusOr<ResolvedJob> {
      try {
        return ResolveJobSpec(wire, ctx);
      } catch (const std::exception& ex) {
        ADD_FAILURE() << "ResolveJobSpec threw " << ex.what() << " on " << spec.DebugString();
        return absl::InternalError("threw");
      }
    }();
    if (r.ok()) {
      ++accepted;
      CheckAccepted(*r, spec);
      if (HasFatalFailure()) return;
    } else {
      EXPECT_FALSE(r.status().message().empty()) << spec.DebugString();
    }
    std::string json;
    if (google::protobuf::util::MessageToJsonString(spec, &json).ok()) {
      v1::JobSpec from_json;
      if (google::protobuf::util::JsonStringToMessage(json, &from_json).ok()) {
        auto again = ResolveJobSpec(from_json, ctx);
        EXPECT_EQ(again.ok(), r.ok()) << json;
      }
    }
  }
  std::printf("spec fuzz: %d iterations, %d accepted\n", iterations, accepted);
  EXPECT_GT(accepted, iterations / 20);  // the mutator reaches the accepting paths too
  fs::remove_all(root);
}

// The daemon tests' 2-block byte-level model (about 0.5 MiB of host state): admitted jobs stay
// cheap.
v1::JobSpec Small() {
  v1::JobSpec s = rp::testing::TinyJobSpec();
  s.mutable_batching()->set_global_batch(2);
  s.mutable_batching()->set_sequence_length(8);
  return s;
}

// The same mutations through the real handlers in-process (no network): a JobManager over a real
// engine (cpu:1) and SQLite store. Accepted specs are admitted and cancelled; random Batch
// messages go into a live streamed job through FeedAsync. Neither may crash or throw, and the
// live job keeps training afterwards.
TEST(SpecFuzz, TheJobManagerTakesMutatedSpecsAndBatches) {
  const fs::path root = fs::temp_directory_path() / ("rp_handler_fuzz_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "jobs");
  auto engine = scheduler::Engine::Create({"cpu:1"});
  ASSERT_TRUE(engine.ok());
  auto store = JobStore::Open((root / "jobs.sqlite").string());
  ASSERT_TRUE(store.ok());
  prometheus::Registry registry;
  DaemonMetrics metrics(registry);
  JobManagerOptions o;
  o.jobs_dir = (root / "jobs").string();
  o.spec.daemon_devices = "cpu:1";
  o.spec.num_devices = 1;
  o.spec.allowed_roots = {root.string()};
  o.spec.max_message_bytes = 1 << 20;
  o.spec.host_memory_budget = [] { return int64_t{8} << 20; };  // keeps accepted jobs small
  auto manager = JobManager::Create(engine->get(), store->get(), &metrics, o);
  ASSERT_TRUE(manager.ok()) << manager.status();
  const char* env = std::getenv("RP_SPEC_FUZZ_ITERATIONS");
  const int iterations = std::min(env ? std::atoi(env) / 10 : 300, 3000);
  int admitted = 0;
  for (int i = 0; i < iterations; ++i) {
    Mutator mut(static_cast<uint64_t>(i) * 104729 + 3, root.string());
    v1::JobSpec spec = Small();
    for (int k = 0; k < 1 + i % 4; ++k) mut.Mutate(&spec);
    v1::JobSpec wire;
    if (!wire.ParseFromString(spec.SerializeAsString())) continue;
    auto job = (*manager)->Submit(wire);
    if (!job.ok()) continue;
    ++admitted;
    EXPECT_TRUE((*manager)->Cancel(job->id()).ok() || (*manager)->Get(job->id()).ok());
  }
  // A live streamed job, fed mutated batches.
  v1::JobSpec live = Small();
  live.set_output_dir((root / "live").string());
  auto job = (*manager)->Submit(live);
  ASSERT_TRUE(job.ok()) << job.status();
  std::atomic<int> fed{0};
  int accepted_batches = 0;
  // As a stream does: a full job queue (ResourceExhausted) means wait and send again.
  auto feed = [&](const v1::Batch& b) {
    for (;;) {
      absl::Status st = (*manager)->FeedAsync(job->id(), b, [&](absl::Status) { ++fed; });
      if (st.code() != absl::StatusCode::kResourceExhausted) return st;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  for (int i = 0; i < iterations; ++i) {
    Mutator mut(static_cast<uint64_t>(i) * 31337 + 5, root.string());
    v1::Batch b;
    b.set_batch(2);
    b.set_sequence(8);
    for (int t = 0; t < 16; ++t) b.add_tokens(t);
    for (int k = 0; k < 1 + i % 3; ++k) mut.Mutate(&b);
    v1::Batch wire;
    if (!wire.ParseFromString(b.SerializeAsString())) continue;
    if (feed(wire).ok()) ++accepted_batches;
  }
  // A good batch still trains: the job is healthy.
  v1::Batch good;
  good.set_batch(2);
  good.set_sequence(8);
  for (int t = 0; t < 16; ++t) good.add_tokens(t % 256);
  ASSERT_TRUE(feed(good).ok());
  ASSERT_TRUE((*manager)->EndStream(job->id(), false).ok());
  for (int spin = 0; spin < 3000; ++spin) {
    auto rec = (*manager)->Get(job->id());
    ASSERT_TRUE(rec.ok());
    if (rec->state() == v1::JOB_STATE_SUCCEEDED || rec->state() == v1::JOB_STATE_FAILED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto rec = (*manager)->Get(job->id());
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->state(), v1::JOB_STATE_SUCCEEDED) << rec->error();
  EXPECT_GE(rec->progress().step(), 1);
  std::printf("handler fuzz: %d specs (%d admitted), %d batches (%d accepted)\n", iterations, admitted, iterations,
              accepted_batches);
  (*manager)->Shutdown();
  (*engine)->Shutdown();
  fs::remove_all(root);
}

}  // namespace
}  // namespace rp::server
