// watch_view.h — what `roundpipe watch` prints for a job's events. In a terminal: a live block
// at the bottom — the train / eval loss curve (loss_chart.h) above a progress line redrawn in
// place — with the job's other events (state changes, evaluations, checkpoints, waits) printed
// above it as plain lines. Not a terminal (a pipe, a log file): plain lines only, a progress line
// at the first step, every tenth and the last.
//
// Contract: one WatchView per watched job, fed from one thread (the Watch callback); writes only
// to the FILE* it was given.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "client/loss_chart.h"
#include "roundpipe/v1/jobs.pb.h"

namespace rp::client {

struct WatchViewOptions {
  bool terminal = false;    // draw the live block (isatty)
  int columns = 100;        // the terminal's width
  int64_t total_steps = 0;  // the job's steps when known (progress "step 7/40")
  // The daemon's workers are CPU workers: the first progress line then says why the bubble it
  // shows is high there.
  bool cpu_workers = false;
};

class WatchView {
 public:
  WatchView(std::string job_id, std::FILE* out, WatchViewOptions options);
  void OnEvent(const roundpipe::v1::JobEvent& e);
  // After the stream ends: leaves the cursor below the live block (not a terminal: prints the
  // curve).
  void Finish();
  roundpipe::v1::JobState final_state() const { return final_state_; }

 private:
  std::string ProgressLine(const roundpipe::v1::StepMetrics& m) const;
  std::string EventLine(const roundpipe::v1::JobEvent& e);  // "" for a step or an event not shown
  void PrintAbove(const std::string& line);                 // a plain line, above the live block
  void Redraw();                                            // the live block, in place

  std::string id_;
  std::FILE* out_;
  WatchViewOptions o_;
  std::vector<ChartPoint> train_, eval_;
  std::string progress_;   // the latest progress line
  std::string eval_note_;  // "  eval 3.2109" once the job was evaluated
  int block_lines_ = 0;    // lines of the live block on screen now
  bool explained_bubble_ = false;
  roundpipe::v1::JobState final_state_ = roundpipe::v1::JOB_STATE_UNSPECIFIED;
};

}  // namespace rp::client
