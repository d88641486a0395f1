// summaries.h — the serialized TensorBoard events the event log writes (proto/tensorboard/
// event.proto): the file-version header, scalars, text and hyperparameters, and what a kept
// record says about itself when a log is trimmed.
//
// Contract: pure functions, any thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace rp::tensorboard {

inline constexpr char kHParamsTag[] = "_hparams_/session_start_info";

std::string FileVersionEvent(double wall_time);
// One event holding every scalar of a step (TensorBoard's scalars dashboard, one series per tag).
std::string ScalarsEvent(int64_t step, const std::vector<std::pair<std::string, double>>& scalars, double wall_time);
// A markdown text (the text plugin).
std::string TextEvent(int64_t step, const std::string& tag, const std::string& markdown, double wall_time);
// The hparams plugin's session start: name -> string, number or bool.
std::string HParamsEvent(const std::vector<std::pair<std::string, std::variant<std::string, double, bool>>>& hparams,
                         const std::string& group, double wall_time);

// What a record is, for the trim: its step, and whether it is the header or the hyperparameters
// (kept whatever the step). `parsed` false: not an event we can read (kept as it is).
struct RecordInfo {
  bool parsed = false;
  int64_t step = 0;
  bool header = false;
  bool hparams = false;
  std::vector<std::string> tags;  // of its summary's values
};
RecordInfo DescribeRecord(const std::string& record);

}  // namespace rp::tensorboard
