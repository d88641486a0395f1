// What `roundpipe watch` prints (watch_view.h).
#include "client/watch_view.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace rp::client {
namespace {

namespace v1 = roundpipe::v1;

std::string Duration(double s) {
  if (s < 0 || !std::isfinite(s)) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, t / 60 % 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%ds", t);
}

std::string StateName(v1::JobState s) {
  std::string n = v1::JobState_Name(s);
  return n.rfind("JOB_STATE_", 0) == 0 ? n.substr(10) : n;
}

}  // namespace

WatchView::WatchView(std::string job_id, std::FILE* out, WatchViewOptions options)
    : id_(std::move(job_id)), out_(out), o_(options) {}

std::string WatchView::ProgressLine(const v1::StepMetrics& m) const {
  return absl::StrFormat("[%s] step %d%s  loss %.4f%s  tokens/s %.0f  lr %.2e  bubble %.1f%%  ETA %s", id_, m.step(),
                         o_.total_steps > 0 ? absl::StrCat("/", o_.total_steps) : "", m.loss(), eval_note_,
                         m.tokens_per_second(), m.learning_rate(), 100 * m.bubble_ratio(), Duration(m.eta_seconds()));
}

std::string WatchView::EventLine(const v1::JobEvent& e) {
  const std::string head = absl::StrCat("[", id_, "] ");
  switch (e.event_case()) {
    case v1::JobEvent::kState:
      final_state_ = e.state();
      return absl::StrCat(head, StateName(e.state()), e.message().empty() ? "" : ": ", e.message());
    case v1::JobEvent::kCheckpoint:
      return absl::StrCat(head, "checkpoint at step ", e.checkpoint().step(), ": ", e.checkpoint().path());
    case v1::JobEvent::kWaiting:
      return head + e.message();
    case v1::JobEvent::kProgress:
      return head + e.progress();
    case v1::JobEvent::kEval: {
      const v1::EvalMetrics& m = e.eval();
      eval_.push_back({m.step(), m.loss()});
      eval_note_ = absl::StrFormat("  eval %.4f", m.loss());
      std::string line = absl::StrFormat(
          "%seval at step %d: loss %.4f over %d tokens (%s)", head, m.step(), m.loss(), m.tokens(),
          m.is_best() ? "best so far" : absl::StrFormat("best %.4f at step %d", m.best_loss(), m.best_step()));
      for (const v1::Sample& s : m.samples()) {  // one line each: a newline shows as a return sign
        std::string text = absl::StrCat(s.prompt(), " \xE2\x9F\xB6 ", s.completion());
        absl::StrReplaceAll({{"\n", "\xE2\x8F\x8E"}, {"\r", ""}, {"\x1b", ""}}, &text);
        absl::StrAppend(&line, "\n", head, "  sample: ", text);
      }
      return line;
    }
    case v1::JobEvent::kPlanChange: {
      std::string cause = absl::AsciiStrToLower(v1::PlanChange::Cause_Name(e.plan_change().cause()));
      absl::StrReplaceAll({{"_", " "}}, &cause);
      return absl::StrCat(head, cause,
                          e.plan_change().worker() >= 0 ? absl::StrCat(" (worker ", e.plan_change().worker(), ")") : "",
                          ": ", e.message());
    }
    case v1::JobEvent::kBatchRejected:
      return absl::StrCat(head, "batch rejected: ", e.batch_rejected());
    case v1::JobEvent::kCheckpointFailed:
      return head + e.checkpoint_failed();
    default:
      return "";
  }
}

void WatchView::OnEvent(const v1::JobEvent& e) {
  if (!e.has_step()) {
    const std::string line = EventLine(e);
    if (!line.empty()) PrintAbove(line);
    if (e.has_eval() && o_.terminal) Redraw();
    return;
  }
  const v1::StepMetrics& m = e.step();
  train_.push_back({m.step(), m.loss()});
  progress_ = ProgressLine(m);
  if (!explained_bubble_ && o_.cpu_workers) {
    explained_bubble_ = true;
    PrintAbove(absl::StrCat("[", id_,
                            "] bubble = the share of the workers' compute time spent waiting in the pipeline. "
                            "CPU workers share the host's cores and a tiny model's stages take "
                            "milliseconds, so it is high here; the schedule at the paper's scale is in "
                            "docs/PERF.md (roundpipe-sim, the paced engine)"));
  }
  if (o_.terminal) {
    Redraw();
  } else if (m.step() == 1 || m.step() % 10 == 0 || (o_.total_steps > 0 && m.step() == o_.total_steps)) {
    std::fprintf(out_, "%s\n", progress_.c_str());
    std::fflush(out_);
  }
}

void WatchView::PrintAbove(const std::string& line) {
  if (o_.terminal && block_lines_ > 0) {
    // Back to the block's first line and clear to the end of the screen; the block comes back
    // below the new line.
    if (block_lines_ > 1) std::fprintf(out_, "\x1b[%dA", block_lines_ - 1);
    std::fprintf(out_, "\r\x1b[J");
    block_lines_ = 0;
    std::fprintf(out_, "%s\n", line.c_str());
    Redraw();
    return;
  }
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void WatchView::Redraw() {
  if (progress_.empty()) return;  // nothing trained yet: no block
  std::vector<std::string> lines;
  if (train_.size() >= 2) {
    ChartOptions c;
    c.width = std::clamp(o_.columns - 14, 20, 100);
    c.height = 10;
    c.color = true;
    lines = RenderLossChart(train_, eval_, c);
  }
  // One screen line each, or the cursor arithmetic below breaks: the progress line is cut to fit.
  lines.push_back(progress_.substr(0, static_cast<size_t>(std::max(20, o_.columns - 1))));
  if (block_lines_ > 1) std::fprintf(out_, "\x1b[%dA", block_lines_ - 1);
  if (block_lines_ > 0) std::fprintf(out_, "\r\x1b[J");
  for (size_t i = 0; i < lines.size(); ++i) {
    std::fprintf(out_, "%s%s", lines[i].c_str(), i + 1 < lines.size() ? "\n" : "");
  }
  block_lines_ = static_cast<int>(lines.size());
  std::fflush(out_);
}

void WatchView::Finish() {
  if (o_.terminal && block_lines_ > 0) std::fprintf(out_, "\n");
  block_lines_ = 0;
  // Not a terminal: the whole curve once, as plain text, when the job is over.
  if (!o_.terminal && train_.size() >= 2) {
    ChartOptions c;
    c.width = 60;
    c.height = 10;
    for (const std::string& line : RenderLossChart(train_, eval_, c)) std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

}  // namespace rp::client
