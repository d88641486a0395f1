// event_log.h — a job's TensorBoard log: the tfevents files of one directory (the daemon uses
// <output_dir>/tensorboard), written by the daemon itself in TensorBoard's own format: scalar
// series, text (sample generations) and the job's hyperparameters (the hparams plugin).
//
// Restarts: Open(dir, resume) first rewrites the directory's event files without the records of
// steps after the resume step (those steps run again and are logged again), without the records
// at that step of what runs again there (an evaluation the checkpoint was written before), and
// without a torn last record (a writer killed mid-record), then starts a new file. So the series
// have no duplicate and no missing step across a kill -9 and a resume from a checkpoint.
//
// Hostile directories: the directory is opened without following a symlink (or handed over
// already opened, confined to the daemon's roots), files are opened
// relative to it with O_NOFOLLOW | O_NONBLOCK, and anything that is not a regular file (a FIFO, a
// device, a symlink) or is larger than kMaxRewriteBytes is left alone and reported in
// `notes()`, never read.
//
// Durability: each Add* is one write of whole records from memory (nothing is buffered in the
// process, so a killed daemon loses nothing it wrote). A failed or short write (a full disk) is
// cut back to the last whole record, so the file stays readable, and reported.
//
// Contract: one EventLog per directory in a process; not thread-safe (the job's event pump owns
// it). Errors are statuses naming the file; the caller decides (the daemon logs and stops
// logging that job: TensorBoard never fails a job).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rp::tensorboard {

class EventLog {
 public:
  static constexpr int64_t kMaxRewriteBytes = int64_t{256} << 20;

  using Scalars = std::vector<std::pair<std::string, double>>;  // tag ("train/loss") -> value
  using HParam = std::variant<std::string, double, bool>;

  // Where the job continues. step 0 = a fresh job (every earlier record of a step > 0 goes).
  struct Resume {
    int64_t step = 0;
    // Records at `step` with a tag starting with one of these go too: they are logged again.
    std::vector<std::string> redo_at_step;
  };
  // Creates `dir` (one level; its parent must exist) or opens it, trims what `resume` says runs
  // again and starts a new file.
  static absl::StatusOr<std::unique_ptr<EventLog>> Open(const std::string& dir, const Resume& resume);
  // The same on a directory the caller opened (confined: scheduler::OpenConfinedDirectory); the
  // log owns `dir_fd` from here on, on failure too. `dir` names it in messages and file_path().
  static absl::StatusOr<std::unique_ptr<EventLog>> OpenAt(int dir_fd, const std::string& dir, const Resume& resume);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // `wall_time`: seconds since the Unix epoch.
  absl::Status AddScalars(int64_t step, const Scalars& scalars, double wall_time);
  // Markdown shown by TensorBoard's text dashboard under `tag`.
  absl::Status AddText(int64_t step, const std::string& tag, const std::string& markdown, double wall_time);
  // The job's hyperparameters, once per job: a no-op when the directory already holds them.
  absl::Status AddHParams(const std::vector<std::pair<std::string, HParam>>& hparams, const std::string& group,
                          double wall_time);

  const std::string& file_path() const { return path_; }
  int64_t dropped_records() const { return dropped_; }  // by Open's trim
  // What Open left alone or repaired, for the daemon's log ("skipped <name>: not a regular file").
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  EventLog(int dir_fd, std::string dir);
  absl::Status TrimExisting(const Resume& resume);
  absl::Status TrimFile(const std::string& name, const Resume& resume);
  absl::Status StartFile();
  absl::Status Append(const std::string& records);

  int dir_fd_ = -1;
  int fd_ = -1;
  std::string dir_, path_;
  int64_t size_ = 0;  // bytes of whole records in the current file
  int64_t dropped_ = 0;
  bool has_hparams_ = false;
  std::vector<std::string> notes_;
};

}  // namespace rp::tensorboard
