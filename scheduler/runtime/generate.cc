// Generation through the pipeline (generate.h).
#include "scheduler/runtime/generate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace rp::scheduler::runtime {

int32_t PickToken(const float* logits, int64_t vocab, double temperature, double uniform) {
  int64_t best = 0;
  for (int64_t v = 1; v < vocab; ++v) {
    if (logits[v] > logits[best]) best = v;
  }
  if (temperature <= 0) return static_cast<int32_t>(best);
  // Softmax in double relative to the maximum, then the first id whose cumulative mass exceeds u.
  std::vector<double> p(static_cast<size_t>(vocab));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    p[static_cast<size_t>(v)] = std::exp((static_cast<double>(logits[v]) - logits[best]) / temperature);
    sum += p[static_cast<size_t>(v)];
  }
  double acc = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    acc += p[static_cast<size_t>(v)] / sum;
    if (uniform < acc) return static_cast<int32_t>(v);
  }
  return static_cast<int32_t>(vocab - 1);
}

absl::StatusOr<std::vector<std::vector<int32_t>>> Generate(Controller& controller,
                                                           const std::vector<std::vector<int32_t>>& prompts,
                                                           const GenerateOptions& o, int microbatches,
                                                           const std::function<bool()>& stop) {
  if (prompts.empty()) return std::vector<std::vector<int32_t>>{};
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) return absl::InvalidArgumentError(absl::StrCat("prompt ", i, " is empty"));
  }
  if (o.max_new_tokens < 0 || !(o.temperature >= 0) || microbatches < 1) {
    return absl::InvalidArgumentError("generation: max_new_tokens and temperature must not be negative");
  }
  const int n = static_cast<int>(prompts.size());
  const int rows = (n + microbatches - 1) / microbatches * microbatches;  // padded with copies of the last
  std::vector<std::vector<int32_t>> seq(prompts.begin(), prompts.end()), out(static_cast<size_t>(n));
  std::vector<bool> done(static_cast<size_t>(n), false);
  std::vector<std::mt19937_64> rng;
  for (int i = 0; i < n; ++i) rng.emplace_back(o.seed * 1000003u + static_cast<uint64_t>(i));
  for (int t = 0; t < o.max_new_tokens; ++t) {
    if (stop && stop()) return absl::CancelledError("generation stopped");
    if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    size_t width = 0;
    for (const auto& s : seq) width = std::max(width, s.size());
    at::Tensor tokens = at::zeros({rows, static_cast<int64_t>(width)}, at::kLong);
    at::Tensor positions = at::zeros({rows, static_cast<int64_t>(width)}, at::kLong);
    auto tok = tokens.accessor<int64_t, 2>();
    auto pos = positions.accessor<int64_t, 2>();
    for (int r = 0; r < rows; ++r) {
      const std::vector<int32_t>& s = seq[static_cast<size_t>(std::min(r, n - 1))];
      const size_t pad = width - s.size();
      for (size_t k = 0; k < width; ++k) {
        const bool in_pad = k < pad;
        tok[r][static_cast<int64_t>(k)] = in_pad ? 0 : s[k - pad];
        pos[r][static_cast<int64_t>(k)] = static_cast<int64_t>(in_pad ? k : k - pad);
      }
    }
    auto logits = controller.LastLogits(tokens, positions);
    if (!logits.ok()) return logits.status();
    const at::Tensor l = logits->contiguous();
    const int64_t vocab = l.size(1);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int i = 0; i < n; ++i) {
      if (done[static_cast<size_t>(i)]) continue;
      const double draw = o.temperature > 0 ? u(rng[static_cast<size_t>(i)]) : 0;
      const int32_t next = PickToken(l[i].data_ptr<float>(), vocab, o.temperature, draw);
      seq[static_cast<size_t>(i)].push_back(next);
      out[static_cast<size_t>(i)].push_back(next);
      if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), next) != o.stop_tokens.end()) {
        done[static_cast<size_t>(i)] = true;
      }
    }
  }
  return out;
}

}  // namespace rp::scheduler::runtime
