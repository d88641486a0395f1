// The daemon's handle on a communicator process (communicator.h).
#include "workers/collective/communicator.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace rp::workers::collective {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kGrace{5};  // beyond an operation's own timeout, for the process to answer

constexpr std::chrono::milliseconds kCancelSlice{250};  // how soon a cancel is seen while connecting

absl::Status Errno(const char* what) { return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno))); }

// Until `fd` is readable (OK), `deadline` passes (DeadlineExceeded) or `cancelled()` (Cancelled),
// looking every kCancelSlice.
absl::Status AwaitReadable(int fd, Clock::time_point deadline, const std::function<bool()>& cancelled) {
  for (;;) {
    if (cancelled()) return absl::CancelledError("cancelled");
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("no answer in time");
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min(left, kCancelSlice).count()));
    if (r > 0) return absl::OkStatus();  // readable, or closed: ReadMessage says which
    if (r < 0 && errno != EINTR) return Errno("poll");
  }
}

// Waits for `pid` to exit, up to `limit`; true when it did (reaped).
bool ReapWithin(pid_t pid, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

std::string DefaultCommBinary() {
  if (const char* env = std::getenv("RP_COMM_BINARY"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("roundpipe-comm") : (self.parent_path() / "roundpipe-comm").string();
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Start(const CommunicatorOptions& o,
                                                                  RendezvousStore* store) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError(absl::StrCat("communicator: rank ", o.rank, " of a group of ", o.size));
  }
  if (o.buffer_bytes < 4 || o.buffer_bytes % 4 != 0) {
    return absl::InvalidArgumentError("communicator: the buffer must hold at least one fp32 element (bytes % 4 == 0)");
  }
  if (store == nullptr) return absl::InvalidArgumentError("communicator: no rendezvous store");
  std::unique_ptr<Communicator> c(new Communicator());
  c->rank_ = o.rank;
  c->size_ = o.size;
  c->bytes_ = o.buffer_bytes;
  c->memfd_ = ::memfd_create("roundpipe-collective", MFD_CLOEXEC);
  if (c->memfd_ < 0) return Errno("memfd_create");
  if (::ftruncate(c->memfd_, o.buffer_bytes) != 0) return Errno("sizing the shared buffer");
  c->buffer_ = ::mmap(nullptr, static_cast<size_t>(o.buffer_bytes), PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd_, 0);
  if (c->buffer_ == MAP_FAILED) {
    c->buffer_ = nullptr;
    return Errno("mapping the shared buffer");
  }
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return Errno("socketpair");
  c->sock_ = pair[0];
  // The child's fds: 3 = its end of the socket, 4 = the buffer (dup2 clears close-on-exec). The
  // sources are moved above both first, so neither dup2 overwrites the other's source.
  const int child_sock = ::fcntl(pair[1], F_DUPFD_CLOEXEC, 16);
  ::close(pair[1]);
  const int child_buf = ::fcntl(c->memfd_, F_DUPFD_CLOEXEC, 16);
  absl::Cleanup close_child_fds = [&] {
    if (child_sock >= 0) ::close(child_sock);
    if (child_buf >= 0) ::close(child_buf);
  };
  if (child_sock < 0 || child_buf < 0) return Errno("fcntl(F_DUPFD_CLOEXEC)");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, child_sock, 3);
  posix_spawn_file_actions_adddup2(&fa, child_buf, 4);
  const std::string binary = o.binary.empty() ? DefaultCommBinary() : o.binary;
  const std::string parent = std::to_string(::getpid());
  char* argv[] = {const_cast<char*>(binary.c_str()), const_cast<char*>(parent.c_str()), nullptr};
  const int rc = ::posix_spawn(&c->pid_, binary.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  std::move(close_child_fds).Invoke();
  if (rc != 0) {
    c->pid_ = -1;
    return absl::UnavailableError(absl::StrCat("cannot start the communicator '", binary, "': ", std::strerror(rc)));
  }
  InitRequest init;
  init.rank = o.rank;
  init.size = o.size;
  init.connect_timeout_ms = o.connect_timeout.count();
  init.buffer_bytes = o.buffer_bytes;
  init.hostname = o.hostname;
  if (absl::Status st = WriteMessage(c->sock_, {MessageKind::kInit, Encode(init)}); !st.ok()) return c->Fail(st);
  if (absl::Status st = c->Rendezvous(store, o.group, o.connect_timeout, o.cancel); !st.ok()) return st;
  return c;
}

absl::Status Communicator::Rendezvous(RendezvousStore* store, const std::string& group,
                                      std::chrono::milliseconds timeout, const std::atomic<bool>* cancel) {
  const auto deadline = Clock::now() + timeout + kGrace;
  const std::string who = absl::StrCat("rank ", rank_, " of ", size_);
  auto cancelled = [&] { return cancel != nullptr && cancel->load(); };
  for (;;) {
    // Wait for the process's next message in slices, so that a cancel is seen.
    if (absl::Status st = AwaitReadable(sock_, deadline, cancelled); !st.ok()) {
      return Fail(absl::Status(st.code(), absl::StrCat(who, ": connecting to its peers: ", st.message())));
    }
    auto m = ReadMessage(sock_, deadline);
    if (!m.ok()) {
      return Fail(absl::Status(m.status().code(), absl::StrCat("rank ", rank_, " of ", size_,
                                                               ": connecting to its peers: ", m.status().message())));
    }
    switch (m->kind) {
      case MessageKind::kReady:
        return absl::OkStatus();
      case MessageKind::kFailed: {
        auto done = DecodeOpDone(m->payload);
        if (!done.ok()) return Fail(done.status());
        return Fail(absl::Status(static_cast<absl::StatusCode>(done->code),
                                 absl::StrCat("rank ", rank_, " of ", size_, ": ", done->message)));
      }
      case MessageKind::kStoreSet:
      case MessageKind::kStoreGet: {
        auto req = DecodeStoreRequest(m->payload);
        if (!req.ok()) return Fail(req.status());
        StoreReply reply;
        const std::string key = absl::StrCat(group, "/", req->key);
        if (m->kind == MessageKind::kStoreSet) {
          const absl::Status st = store->Set(key, req->value);
          reply.code = static_cast<int32_t>(st.code());
          reply.message = std::string(st.message());
        } else {
          const auto until = std::min(deadline, Clock::now() + std::chrono::milliseconds(req->timeout_ms));
          absl::StatusOr<std::string> value;
          do {  // in slices, so that a cancel is seen
            value = store->Get(key, std::min(until, Clock::now() + kCancelSlice));
          } while (!value.ok() && value.status().code() == absl::StatusCode::kDeadlineExceeded &&
                   Clock::now() < until && !cancelled());
          if (cancelled()) {
            return Fail(absl::CancelledError(absl::StrCat(who, ": connecting to its peers: cancelled")));
          }
          reply.code = static_cast<int32_t>(value.status().code());
          if (value.ok())
            reply.value = *value;
          else
            reply.message = std::string(value.status().message());
        }
        if (absl::Status st = WriteMessage(sock_, {MessageKind::kStoreReply, Encode(reply)}); !st.ok()) return Fail(st);
        break;
      }
      default:
        return Fail(absl::InternalError("the communicator sent an unexpected message while connecting"));
    }
  }
}

absl::Status Communicator::CheckOp(const OpRequest& op) const {
  auto inside = [this](int64_t offset, int64_t elements) {
    return offset >= 0 && elements >= 0 && offset % 4 == 0 && elements <= bytes_ / 4 && offset <= bytes_ - elements * 4;
  };
  const char* name = CollectiveOpName(op.op);
  if (op.timeout_ms <= 0) return absl::InvalidArgumentError(absl::StrCat(name, ": a timeout is required"));
  if (op.bf16_input && op.op != CollectiveOp::kReduceScatter) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": bf16 input is for the reduce-scatter only"));
  }
  switch (op.op) {
    case CollectiveOp::kBarrier:
      return absl::OkStatus();
    case CollectiveOp::kAllReduce:
    case CollectiveOp::kBroadcast:
      if (!inside(op.offset, op.count) || op.root < 0 || op.root >= size_) break;
      return absl::OkStatus();
    case CollectiveOp::kAllGather:
      if (!inside(op.offset, op.count) || op.count > bytes_ / 4 / size_ || !inside(op.out_offset, op.count * size_))
        break;
      return absl::OkStatus();
    case CollectiveOp::kAllGatherV: {
      if (static_cast<int>(op.counts.size()) != size_ || !inside(op.out_offset, op.count)) break;
      int64_t sum = 0;
      for (int64_t n : op.counts) sum += n < 0 ? op.count + 1 : n;
      if (sum != op.count || !inside(op.offset, op.counts[static_cast<size_t>(rank_)])) break;
      return absl::OkStatus();
    }
    case CollectiveOp::kReduceScatter: {
      // bf16 input: count x 2 bytes, checked as whole fp32 elements.
      if (!inside(op.offset, op.bf16_input ? (op.count + 1) / 2 : op.count) ||
          static_cast<int>(op.counts.size()) != size_) {
        break;
      }
      int64_t sum = 0;
      for (int64_t n : op.counts) sum += n < 0 ? op.count + 1 : n;
      if (sum != op.count || !inside(op.out_offset, op.counts[static_cast<size_t>(rank_)])) break;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(name, ": offsets or counts outside the shared buffer of ", bytes_,
                                                 " bytes (or counts that do not add up)"));
}

absl::Status Communicator::Run(const OpRequest& op) {
  if (!dead_.ok()) return absl::FailedPreconditionError(absl::StrCat("the communicator is gone: ", dead_.message()));
  if (absl::Status st = CheckOp(op); !st.ok()) return st;
  if (absl::Status st = WriteMessage(sock_, {MessageKind::kOp, Encode(op)}); !st.ok()) return Fail(st);
  const auto deadline = Clock::now() + std::chrono::milliseconds(op.timeout_ms) + kGrace;
  auto m = ReadMessage(sock_, deadline);
  const std::string what = absl::StrCat(CollectiveOpName(op.op), " on rank ", rank_, " of ", size_);
  if (!m.ok()) return Fail(absl::Status(m.status().code(), absl::StrCat(what, ": ", m.status().message())));
  if (m->kind != MessageKind::kOpDone && m->kind != MessageKind::kFailed) {
    return Fail(absl::InternalError(absl::StrCat(what, ": unexpected message from the communicator")));
  }
  auto done = DecodeOpDone(m->payload);
  if (!done.ok()) return Fail(done.status());
  absl::Status st(static_cast<absl::StatusCode>(done->code), absl::StrCat(what, ": ", done->message));
  if (done->code == 0) return absl::OkStatus();
  return Fail(st);  // a failed collective leaves Gloo's pairs unusable: the process is gone
}

absl::Status Communicator::Fail(absl::Status why) {
  if (dead_.ok()) dead_ = why;
  Kill();
  return why;
}

void Communicator::Kill() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ReapWithin(pid_, std::chrono::seconds(10));
    pid_ = -1;
  }
  if (dead_.ok()) dead_ = absl::UnavailableError("the communicator was killed");
}

Communicator::~Communicator() {
  if (pid_ > 0 && sock_ >= 0) {
    (void)WriteMessage(sock_, {MessageKind::kShutdown, ""});
    if (ReapWithin(pid_, std::chrono::seconds(2))) pid_ = -1;
  }
  Kill();
  if (sock_ >= 0) ::close(sock_);
  if (buffer_ != nullptr) ::munmap(buffer_, static_cast<size_t>(bytes_));
  if (memfd_ >= 0) ::close(memfd_);
}

}  // namespace rp::workers::collective
