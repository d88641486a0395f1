// communicator.h — the daemon's handle on one communicator process (roundpipe-comm): the member
// `rank` of a group of `size` that runs Gloo collectives on fp32 data in a buffer shared with the
// daemon (a memfd both map). Start spawns the process, answers its rendezvous from a
// RendezvousStore and returns once every peer is connected; Run performs one collective and
// returns when it completed on this rank. Why a process: comm_wire.h.
//
// Faults: every operation has a deadline (the request's timeout in Gloo, plus a grace period
// here); a peer that died or went silent fails the operation with Unavailable naming the rank
// and the operation, and the communicator is then dead (its process gone): every later call
// returns that first error. Nothing here ever waits without a deadline, and the destructor
// kills a process that does not exit when asked.
//
// Contract: one caller at a time per Communicator (an engine's optimizer worker); Start and the
// destructor from any thread. The buffer stays mapped until destruction.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workers/collective/comm_wire.h"
#include "workers/spec/rendezvous_store.h"

namespace rp::workers::collective {

using spec::InMemoryStore;
using spec::RendezvousStore;  // workers/spec/rendezvous_store.h

struct CommunicatorOptions {
  std::string binary;  // roundpipe-comm; empty: DefaultCommBinary()
  int rank = 0;
  int size = 1;
  std::string hostname = "127.0.0.1";  // this rank's address for Gloo's TCP transport
  int64_t buffer_bytes = 0;            // the shared buffer (a multiple of 4: fp32 elements)
  std::chrono::milliseconds connect_timeout{30000};
  // Prefixed to every rendezvous key: one group's (a job's, an incarnation's) keys never meet
  // another's in a shared store.
  std::string group;
  // Connecting gives up (Cancelled) within a quarter second once this turns true (a job
  // cancelled while its peers are awaited); null: only the timeout ends the wait.
  const std::atomic<bool>* cancel = nullptr;
};

// $RP_COMM_BINARY when set, else roundpipe-comm beside the running executable.
std::string DefaultCommBinary();

class Communicator {
 public:
  // InvalidArgument for bad options; Unavailable / DeadlineExceeded when the process could not
  // start or the peers did not all connect in time (naming what is missing).
  static absl::StatusOr<std::unique_ptr<Communicator>> Start(const CommunicatorOptions& options,
                                                             RendezvousStore* store);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  float* data() const { return static_cast<float*>(buffer_); }
  int64_t bytes() const { return bytes_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  pid_t pid() const { return pid_; }

  // One collective (comm_wire.h OpRequest says what each does). InvalidArgument for offsets or
  // counts outside the buffer (nothing runs); otherwise the collective's outcome.
  absl::Status Run(const OpRequest& op);
  // The process killed at once (a test's injected fault; a job that gives up on its group).
  void Kill();
  // OK while usable; the error that ended it otherwise.
  absl::Status health() const { return dead_; }

 private:
  Communicator() = default;
  absl::Status Rendezvous(RendezvousStore* store, const std::string& group, std::chrono::milliseconds timeout,
                          const std::atomic<bool>* cancel);
  absl::Status CheckOp(const OpRequest& op) const;
  absl::Status Fail(absl::Status why);  // records the first error, kills the process, returns it

  int rank_ = 0;
  int size_ = 1;
  int sock_ = -1;
  int memfd_ = -1;
  void* buffer_ = nullptr;
  int64_t bytes_ = 0;
  pid_t pid_ = -1;
  absl::Status dead_ = absl::OkStatus();
};

}  // namespace rp::workers::collective
