// record_file.h — the framing of TensorBoard's event files (the TFRecord format): each record is
// its length (8 bytes, little-endian), the masked CRC-32C of those 8 bytes, the data, and the
// masked CRC-32C of the data. Framing and parsing only; the file I/O is the event log's.
//
// Contract: pure functions, any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rp::tensorboard {

// One record around `data`.
std::string FrameRecord(std::string_view data);

struct ParsedRecords {
  std::vector<std::string> records;  // the data of each intact record, in file order
  int64_t intact_bytes = 0;          // the prefix of the file they fill
  // A record was cut short (a writer killed mid-write) or its checksums do not match: it and
  // everything after it are not in `records`.
  bool damaged_tail = false;
};
// Parses a whole file's bytes, stopping at the first record that is incomplete or corrupt, and
// at a record longer than `max_record_bytes` (a garbage length must not make us allocate it).
ParsedRecords ParseRecords(std::string_view bytes, int64_t max_record_bytes = int64_t{64} << 20);

}  // namespace rp::tensorboard
