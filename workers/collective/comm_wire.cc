// The communicator's wire format (comm_wire.h).
#include "workers/collective/comm_wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace rp::workers::collective {

namespace {

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutI64(std::string* out, int64_t v) { PutU64(out, static_cast<uint64_t>(v)); }
void PutString(std::string* out, const std::string& s) {
  PutU64(out, s.size());
  out->append(s);
}

// Reads fields off a payload; any overrun marks it bad (checked once at the end).
class Reader {
 public:
  explicit Reader(const std::string& p) : p_(p) {}
  uint64_t U64() {
    if (p_.size() - at_ < 8 || bad_) {
      bad_ = true;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p_[at_ + i])) << (8 * i);
    at_ += 8;
    return v;
  }
  int64_t I64() { return static_cast<int64_t>(U64()); }
  std::string String() {
    const uint64_t n = U64();
    if (bad_ || n > p_.size() - at_) {
      bad_ = true;
      return {};
    }
    std::string s = p_.substr(at_, n);
    at_ += n;
    return s;
  }
  absl::Status Done(const char* what) const {
    if (bad_ || at_ != p_.size()) return absl::InvalidArgumentError(absl::StrCat("malformed ", what, " message"));
    return absl::OkStatus();
  }

 private:
  const std::string& p_;
  size_t at_ = 0;
  bool bad_ = false;
};

absl::Status WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return absl::UnavailableError(absl::StrCat("the communicator's socket: ", std::strerror(errno)));
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  while (n > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("no message in time");
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    if (ready == 0) continue;
    const ssize_t r = ::read(fd, data, n);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r < 0) return absl::UnavailableError(absl::StrCat("the communicator's socket: ", std::strerror(errno)));
    if (r == 0) return absl::UnavailableError("the other end closed the socket");
    data += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace

const char* CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce:
      return "all-reduce";
    case CollectiveOp::kReduceScatter:
      return "reduce-scatter";
    case CollectiveOp::kAllGather:
      return "all-gather";
    case CollectiveOp::kAllGatherV:
      return "all-gather (blocks of any size)";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kBarrier:
      return "barrier";
  }
  return "?";
}

std::string Encode(const InitRequest& r) {
  std::string out;
  PutI64(&out, r.rank);
  PutI64(&out, r.size);
  PutI64(&out, r.connect_timeout_ms);
  PutI64(&out, r.buffer_bytes);
  PutString(&out, r.hostname);
  return out;
}

std::string Encode(const OpRequest& r) {
  std::string out;
  PutU64(&out, static_cast<uint32_t>(r.op));
  PutI64(&out, r.offset);
  PutI64(&out, r.count);
  PutI64(&out, r.out_offset);
  PutI64(&out, r.root);
  PutI64(&out, r.timeout_ms);
  PutU64(&out, r.counts.size());
  for (int64_t c : r.counts) PutI64(&out, c);
  PutU64(&out, r.bf16_input ? 1 : 0);
  return out;
}

std::string Encode(const OpDone& r) {
  std::string out;
  PutI64(&out, r.code);
  PutString(&out, r.message);
  return out;
}

std::string Encode(const StoreRequest& r) {
  std::string out;
  PutString(&out, r.key);
  PutString(&out, r.value);
  PutI64(&out, r.timeout_ms);
  return out;
}

std::string Encode(const StoreReply& r) {
  std::string out;
  PutI64(&out, r.code);
  PutString(&out, r.value);
  PutString(&out, r.message);
  return out;
}

absl::StatusOr<InitRequest> DecodeInit(const std::string& payload) {
  Reader in(payload);
  InitRequest r;
  r.rank = static_cast<int32_t>(in.I64());
  r.size = static_cast<int32_t>(in.I64());
  r.connect_timeout_ms = in.I64();
  r.buffer_bytes = in.I64();
  r.hostname = in.String();
  if (absl::Status st = in.Done("init"); !st.ok()) return st;
  return r;
}

absl::StatusOr<OpRequest> DecodeOp(const std::string& payload) {
  Reader in(payload);
  OpRequest r;
  r.op = static_cast<CollectiveOp>(in.U64());
  r.offset = in.I64();
  r.count = in.I64();
  r.out_offset = in.I64();
  r.root = static_cast<int32_t>(in.I64());
  r.timeout_ms = in.I64();
  const uint64_t n = in.U64();
  if (n > 4096) return absl::InvalidArgumentError("malformed op message: too many counts");
  for (uint64_t i = 0; i < n; ++i) r.counts.push_back(in.I64());
  r.bf16_input = in.U64() != 0;
  if (absl::Status st = in.Done("op"); !st.ok()) return st;
  return r;
}

absl::StatusOr<OpDone> DecodeOpDone(const std::string& payload) {
  Reader in(payload);
  OpDone r;
  r.code = static_cast<int32_t>(in.I64());
  r.message = in.String();
  if (absl::Status st = in.Done("op-done"); !st.ok()) return st;
  return r;
}

absl::StatusOr<StoreRequest> DecodeStoreRequest(const std::string& payload) {
  Reader in(payload);
  StoreRequest r;
  r.key = in.String();
  r.value = in.String();
  r.timeout_ms = in.I64();
  if (absl::Status st = in.Done("store request"); !st.ok()) return st;
  return r;
}

absl::StatusOr<StoreReply> DecodeStoreReply(const std::string& payload) {
  Reader in(payload);
  StoreReply r;
  r.code = static_cast<int32_t>(in.I64());
  r.value = in.String();
  r.message = in.String();
  if (absl::Status st = in.Done("store reply"); !st.ok()) return st;
  return r;
}

absl::Status WriteMessage(int fd, const Message& m) {
  if (m.payload.size() > kMaxPayloadBytes) return absl::InvalidArgumentError("message payload too large");
  std::string frame;
  PutU64(&frame, (uint64_t{static_cast<uint32_t>(m.kind)} << 32) | kWireMagic);
  PutU64(&frame, m.payload.size());
  frame += m.payload;
  return WriteAll(fd, frame.data(), frame.size());
}

absl::StatusOr<Message> ReadMessage(int fd, std::chrono::steady_clock::time_point deadline) {
  char header[16];
  if (absl::Status st = ReadAll(fd, header, sizeof(header), deadline); !st.ok()) return st;
  const std::string h(header, sizeof(header));
  Reader in(h);
  const uint64_t word = in.U64();
  const uint64_t bytes = in.U64();
  if ((word & 0xffffffffu) != kWireMagic) return absl::InvalidArgumentError("bad message header (magic)");
  if (bytes > kMaxPayloadBytes) return absl::InvalidArgumentError("bad message header (payload too large)");
  Message m;
  m.kind = static_cast<MessageKind>(word >> 32);
  m.payload.resize(bytes);
  if (bytes > 0) {
    if (absl::Status st = ReadAll(fd, m.payload.data(), bytes, deadline); !st.ok()) return st;
  }
  return m;
}

}  // namespace rp::workers::collective
