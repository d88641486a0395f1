// rendezvous_store.h — where the communicators of one data-parallel job find each other: a
// key-value store the daemon answers on their behalf (each communicator asks its own daemon over
// its socket; Gloo's full-mesh connect publishes every rank's address under a key and waits for
// the others'). The store is the daemon's own code; the bytes of the collectives are Gloo's.
//
// The interface lives here, with the shared value types, because three rooms meet at it: the
// data plane asks it (workers/collective), the engine picks one per job (EngineOptions::
// rendezvous_store), and the daemon serves one to its cluster's peers and asks a coordinator's
// over gRPC (server/cluster_*). InMemoryStore serves the nodes of one process and a
// coordinator's peers.
//
// Contract: implementations are thread-safe; Get waits for the key until the deadline
// (DeadlineExceeded naming the key) and never holds a lock while waiting on anything else.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workers/base/mutex.h"

namespace rp::spec {

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  virtual absl::StatusOr<std::string> Get(const std::string& key, std::chrono::steady_clock::time_point deadline) = 0;
};

class InMemoryStore : public RendezvousStore {
 public:
  // At most this many keys (a communicator that floods the store is refused).
  static constexpr size_t kMaxKeys = 1 << 16;
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, std::chrono::steady_clock::time_point deadline) override;
  // Forgets every key that starts with `prefix` (a job's group once the job ended): returns how
  // many. A Get waiting on one of them keeps waiting until its deadline.
  size_t ErasePrefix(const std::string& prefix);
  size_t size() const;

 private:
  mutable base::Mutex mu_;
  base::CondVar cv_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rp::spec
