// roundpipe-comm — a daemon's communicator process (communicator.h, comm_wire.h): links Debian's
// Gloo and no LibTorch. Started by the daemon with its socket on fd 3 and the shared buffer on
// fd 4 (argv[1]: the daemon's pid); connects to its peers through Gloo's TCP transport (the
// rendezvous keys go through the daemon), then runs one collective per request on fp32 data in
// the buffer until told to stop. Any failure is reported and ends the process: Gloo's pairs are
// unusable after an error, and the daemon starts a new group.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "workers/collective/comm_wire.h"

namespace {

namespace rc = rp::workers::collective;
using Clock = std::chrono::steady_clock;
constexpr int kSocket = 3;
constexpr int kBuffer = 4;

// Gloo's rendezvous store, answered by the daemon over the socket (workers/spec/rendezvous_store.h).
class DaemonStore : public gloo::rendezvous::Store {
 public:
  explicit DaemonStore(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    rc::StoreRequest r;
    r.key = key;
    r.value.assign(data.begin(), data.end());
    Ask(rc::MessageKind::kStoreSet, r);
  }
  std::vector<char> get(const std::string& key) override {
    rc::StoreRequest r;
    r.key = key;
    r.timeout_ms = timeout_.count();
    const std::string v = Ask(rc::MessageKind::kStoreGet, r);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const std::string& k : keys) {
      rc::StoreRequest r;
      r.key = k;
      r.timeout_ms = timeout.count();
      (void)Ask(rc::MessageKind::kStoreGet, r);
    }
  }

 private:
  std::string Ask(rc::MessageKind kind, const rc::StoreRequest& r) {
    if (absl::Status st = rc::WriteMessage(kSocket, {kind, rc::Encode(r)}); !st.ok()) {
      throw gloo::IoException(std::string(st.message()));
    }
    auto m = rc::ReadMessage(kSocket, Clock::now() + timeout_ + std::chrono::seconds(5));
    if (!m.ok() || m->kind != rc::MessageKind::kStoreReply) {
      throw gloo::IoException(absl::StrCat("rendezvous: no answer from the daemon for '", r.key, "'"));
    }
    auto reply = rc::DecodeStoreReply(m->payload);
    if (!reply.ok()) throw gloo::IoException(std::string(reply.status().message()));
    if (reply->code != 0) throw gloo::IoException(reply->message);
    return reply->value;
  }
  std::chrono::milliseconds timeout_;
};

rc::OpDone Outcome(absl::StatusCode code, const std::string& message) {
  return rc::OpDone{static_cast<int32_t>(code), message};
}

// One collective on the buffer (the daemon checked the offsets; checked again here).
rc::OpDone RunOp(const std::shared_ptr<gloo::rendezvous::Context>& ctx, char* base, int64_t bytes,
                 const rc::OpRequest& op) {
  auto inside = [bytes](int64_t offset, int64_t n) {
    return offset >= 0 && n >= 0 && n <= bytes / 4 && offset <= bytes - n * 4;
  };
  const int size = ctx->size;
  const int rank = ctx->rank;
  auto* in = reinterpret_cast<float*>(base + op.offset);
  auto* out = reinterpret_cast<float*>(base + op.out_offset);
  const std::chrono::milliseconds timeout(op.timeout_ms);
  ctx->setTimeout(timeout);
  switch (op.op) {
    case rc::CollectiveOp::kBarrier: {
      gloo::BarrierOptions o(ctx);
      o.setTimeout(timeout);
      gloo::barrier(o);
      break;
    }
    case rc::CollectiveOp::kAllReduce: {
      if (!inside(op.offset, op.count)) return Outcome(absl::StatusCode::kInvalidArgument, "outside the buffer");
      gloo::AllreduceOptions o(ctx);
      o.setOutput(in, static_cast<size_t>(op.count));
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      o.setTimeout(timeout);
      gloo::allreduce(o);
      break;
    }
    case rc::CollectiveOp::kBroadcast: {
      if (!inside(op.offset, op.count)) return Outcome(absl::StatusCode::kInvalidArgument, "outside the buffer");
      gloo::BroadcastOptions o(ctx);
      o.setOutput(in, static_cast<size_t>(op.count));
      o.setRoot(op.root);
      o.setTimeout(timeout);
      gloo::broadcast(o);
      break;
    }
    case rc::CollectiveOp::kAllGather: {
      if (!inside(op.offset, op.count) || !inside(op.out_offset, op.count * size)) {
        return Outcome(absl::StatusCode::kInvalidArgument, "outside the buffer");
      }
      gloo::AllgatherOptions o(ctx);
      o.setInput(in, static_cast<size_t>(op.count));
      o.setOutput(out, static_cast<size_t>(op.count * size));
      o.setTimeout(timeout);
      gloo::allgather(o);
      break;
    }
    case rc::CollectiveOp::kAllGatherV: {
      if (static_cast<int>(op.counts.size()) != size || !inside(op.out_offset, op.count)) {
        return Outcome(absl::StatusCode::kInvalidArgument, "outside the buffer");
      }
      std::vector<size_t> counts;
      int64_t sum = 0;
      for (int64_t n : op.counts) {
        if (n < 0) return Outcome(absl::StatusCode::kInvalidArgument, "a negative count");
        counts.push_back(static_cast<size_t>(n));
        sum += n;
      }
      if (sum != op.count || !inside(op.offset, op.counts[static_cast<size_t>(rank)])) {
        return Outcome(absl::StatusCode::kInvalidArgument, "outside the buffer");
      }
      gloo::AllgathervOptions o(ctx);
      o.setInput(in, counts[static_cast<size_t>(rank)]);
      o.setOutput(out, counts);
      o.setTimeout(timeout);
      gloo::allgatherv(o);
      break;
    }
    case rc::CollectiveOp::kReduceScatter: {
      if (!inside(op.offset, op.bf16_input ? (op.count + 1) / 2 : op.count) ||
          static_cast<int>(op.counts.size()) != size || !inside(op.out_offset, op.counts[static_cast<size_t>(rank)])) {
        return Outcome(absl::StatusCode::kInvalidArgument, "outside the buffer");
      }
      // Gloo's all-to-all moves each rank's block r to rank r, (size-1)/size of the data per
      // rank, and the blocks received are summed here in rank order (the same order on every
      // rank). Not Gloo's halving-doubling reduce-scatter: Debian's snapshot of it returned wrong
      // sums on three ranks when called round after round (tests/unit/workers/data_parallel_test.cc).
      int64_t sum_counts = 0;
      for (int64_t n : op.counts) sum_counts += n < 0 ? op.count + 1 : n;
      if (sum_counts != op.count) return Outcome(absl::StatusCode::kInvalidArgument, "counts that do not add up");
      const size_t mine = static_cast<size_t>(op.counts[static_cast<size_t>(rank)]);
      const std::vector<int64_t> send(op.counts.begin(), op.counts.end());
      const std::vector<int64_t> recv(static_cast<size_t>(size), static_cast<int64_t>(mine));
      if (op.bf16_input) {
        // bf16 on the wire: the blocks received widened to fp32 (a bf16 is an fp32's high half).
        // Scratch kept between calls (fresh pages each round cost more than the sums).
        static std::vector<uint16_t> blocks;
        blocks.resize(std::max(blocks.size(), mine * static_cast<size_t>(size)));
        if (op.count > 0) {
          gloo::AlltoallvOptions o(ctx);
          o.setInput(reinterpret_cast<uint16_t*>(base + op.offset), send);
          o.setOutput(blocks.data(), recv);
          o.setTimeout(timeout);
          gloo::alltoallv(o);
        }
        auto widen = [](uint16_t h) {
          const uint32_t bits = static_cast<uint32_t>(h) << 16;
          float f;
          std::memcpy(&f, &bits, 4);
          return f;
        };
        for (size_t i = 0; i < mine; ++i) {
          float sum = widen(blocks[i]);
          for (size_t r = 1; r < static_cast<size_t>(size); ++r) sum += widen(blocks[r * mine + i]);
          out[i] = sum;
        }
        break;
      }
      static std::vector<float> blocks;  // kept between calls, as above
      blocks.resize(std::max(blocks.size(), mine * static_cast<size_t>(size)));
      if (op.count > 0) {
        gloo::AlltoallvOptions o(ctx);
        o.setInput(in, send);
        o.setOutput(blocks.data(), recv);
        o.setTimeout(timeout);
        gloo::alltoallv(o);
      }
      for (size_t i = 0; i < mine; ++i) {
        float sum = blocks[i];
        for (size_t r = 1; r < static_cast<size_t>(size); ++r) sum += blocks[r * mine + i];
        out[i] = sum;
      }
      break;
    }
    default:
      return Outcome(absl::StatusCode::kInvalidArgument, "unknown collective");
  }
  return Outcome(absl::StatusCode::kOk, "");
}

int Serve(pid_t parent) {
  // Lives as long as the daemon's end of the socket: a daemon gone (even killed) closes it, and
  // the next read here ends the process (not PR_SET_PDEATHSIG: it fires when the spawning thread
  // ends, which may be long before the daemon does).
  if (::getppid() != parent) return 1;
  auto first = rc::ReadMessage(kSocket, Clock::now() + std::chrono::seconds(60));
  if (!first.ok() || first->kind != rc::MessageKind::kInit) return 2;
  auto init = rc::DecodeInit(first->payload);
  if (!init.ok() || init->size < 1 || init->rank < 0 || init->rank >= init->size || init->buffer_bytes < 4) return 2;
  void* mapped =
      ::mmap(nullptr, static_cast<size_t>(init->buffer_bytes), PROT_READ | PROT_WRITE, MAP_SHARED, kBuffer, 0);
  if (mapped == MAP_FAILED) return 3;
  char* base = static_cast<char*>(mapped);
  auto fail = [](absl::StatusCode code, const std::string& why) {
    (void)rc::WriteMessage(kSocket, {rc::MessageKind::kFailed, rc::Encode(Outcome(code, why))});
    return 4;
  };
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  try {
    const std::chrono::milliseconds timeout(init->connect_timeout_ms);
    gloo::transport::tcp::attr attr;
    attr.hostname = init->hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    ctx = std::make_shared<gloo::rendezvous::Context>(init->rank, init->size);
    ctx->setTimeout(timeout);
    DaemonStore store(timeout);
    ctx->connectFullMesh(store, device);
  } catch (const std::exception& e) {
    return fail(absl::StatusCode::kUnavailable, absl::StrCat("connecting the group: ", e.what()));
  }
  if (!rc::WriteMessage(kSocket, {rc::MessageKind::kReady, ""}).ok()) return 5;
  for (;;) {
    auto m = rc::ReadMessage(kSocket, Clock::now() + std::chrono::hours(24 * 365));
    if (!m.ok() || m->kind == rc::MessageKind::kShutdown) return 0;
    if (m->kind != rc::MessageKind::kOp) return fail(absl::StatusCode::kInternal, "unexpected message");
    auto op = rc::DecodeOp(m->payload);
    if (!op.ok()) return fail(absl::StatusCode::kInvalidArgument, std::string(op.status().message()));
    rc::OpDone done;
    try {
      done = RunOp(ctx, base, init->buffer_bytes, *op);
    } catch (const gloo::IoException& e) {
      return fail(absl::StatusCode::kUnavailable, absl::StrCat("a peer failed or went silent: ", e.what()));
    } catch (const std::exception& e) {
      return fail(absl::StatusCode::kInternal, e.what());
    }
    if (done.code != 0) return fail(static_cast<absl::StatusCode>(done.code), done.message);
    if (!rc::WriteMessage(kSocket, {rc::MessageKind::kOpDone, rc::Encode(done)}).ok()) return 5;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "roundpipe-comm: started by roundpiped only (fd 3: its socket, fd 4: the shared buffer)\n");
    return 2;
  }
  return Serve(static_cast<pid_t>(std::atoll(argv[1])));
}
