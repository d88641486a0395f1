// comm_wire.h — the messages between the daemon and its communicator process (roundpipe-comm,
// comm_main.cc) over their Unix stream socket: a fixed header (magic, kind, payload length) and a
// payload of little-endian fields. The data itself never crosses the socket: it lies in the
// shared buffer (shared_buffer.h), and an operation names byte offsets into it.
//
// Why a process: PyPI's LibTorch exports its own, newer copy of Gloo's symbols, with another ABI
// than Debian's libgloo; in one process the two interpose each other by load order. The
// communicator links Debian's Gloo and no LibTorch, so each side binds its own copy by
// construction, and a wedged collective is a process to kill, never a stuck daemon thread.
//
// Contract: pure encoding (any thread); ReadMessage and WriteMessage block on one fd until the
// deadline and refuse payloads above kMaxPayloadBytes (a peer's garbage never allocates more).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rp::workers::collective {

inline constexpr uint32_t kWireMagic = 0x52504331;  // "RPC1"
inline constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 20;

enum class MessageKind : uint32_t {
  // daemon -> communicator
  kInit = 1,        // InitRequest
  kOp = 2,          // OpRequest
  kStoreReply = 3,  // StoreReply
  kShutdown = 4,    // no payload: exit after the current operation
  // communicator -> daemon
  kReady = 16,     // no payload: every peer is connected
  kOpDone = 17,    // OpDone
  kStoreSet = 18,  // StoreRequest (key, value)
  kStoreGet = 19,  // StoreRequest (key, timeout): waits for the key
  kFailed = 20,    // OpDone (status): the communicator cannot go on (it exits)
};

struct Message {
  MessageKind kind = MessageKind::kInit;
  std::string payload;
};

enum class CollectiveOp : uint32_t {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kAllGatherV = 6,
};
const char* CollectiveOpName(CollectiveOp op);

struct InitRequest {
  int32_t rank = 0;
  int32_t size = 1;
  int64_t connect_timeout_ms = 30000;
  int64_t buffer_bytes = 0;  // the shared buffer's size (fd 4 in the communicator)
  std::string hostname;      // the address this rank's Gloo device binds and peers dial
};

// One collective on fp32 data in the shared buffer (offsets in bytes, counts in elements):
//  kAllReduce: `count` elements at `offset` summed over the ranks, in place.
//  kReduceScatter: `count` elements at `offset` summed; rank r receives the r-th block of
//    `counts` (sum(counts) == count; blocks may be empty) at `out_offset` (Gloo's all-to-all
//    of the blocks, summed in rank order on arrival).
//  kAllGather: each rank's `count` elements at `offset` gathered in rank order at `out_offset`
//    (size x count elements).
//  kAllGatherV: rank r's `counts[r]` elements at `offset` gathered in rank order at
//    `out_offset` (`count` == sum(counts) elements; blocks may be empty).
//  kBroadcast: `count` elements at `offset` from rank `root` to every rank.
//  kBarrier: no data.
struct OpRequest {
  CollectiveOp op = CollectiveOp::kBarrier;
  int64_t offset = 0;
  int64_t count = 0;
  int64_t out_offset = 0;
  int32_t root = 0;
  int64_t timeout_ms = 30000;
  std::vector<int64_t> counts;
  // kReduceScatter only: the input holds `count` bf16 values (2 bytes each) at `offset`, which
  // cross the wire as they are and are summed in fp32 on arrival (the output stays fp32).
  bool bf16_input = false;
};

struct OpDone {
  int32_t code = 0;  // absl::StatusCode
  std::string message;
};

struct StoreRequest {
  std::string key;
  std::string value;       // kStoreSet
  int64_t timeout_ms = 0;  // kStoreGet
};

struct StoreReply {
  int32_t code = 0;
  std::string value;
  std::string message;
};

std::string Encode(const InitRequest& r);
std::string Encode(const OpRequest& r);
std::string Encode(const OpDone& r);
std::string Encode(const StoreRequest& r);
std::string Encode(const StoreReply& r);
// InvalidArgument for a truncated or oversized payload, or one with bytes left over.
absl::StatusOr<InitRequest> DecodeInit(const std::string& payload);
absl::StatusOr<OpRequest> DecodeOp(const std::string& payload);
absl::StatusOr<OpDone> DecodeOpDone(const std::string& payload);
absl::StatusOr<StoreRequest> DecodeStoreRequest(const std::string& payload);
absl::StatusOr<StoreReply> DecodeStoreReply(const std::string& payload);

// Whole messages on a blocking stream fd. Unavailable when the peer closed it; DeadlineExceeded
// past `deadline`; InvalidArgument for a bad header (wrong magic, oversized payload).
absl::Status WriteMessage(int fd, const Message& m);
absl::StatusOr<Message> ReadMessage(int fd, std::chrono::steady_clock::time_point deadline);

}  // namespace rp::workers::collective
