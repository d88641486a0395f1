// adamw_bench — the fused CPU AdamW kernel (per SIMD path, 1 and 2 threads) against
// torch::optim::AdamW on the same 16M-parameter tensor, median of interleaved runs. Prints a
// table; a benchmark, not a test.   build/tests/bench/adamw_bench [rounds]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "workers/optim/cpu_adamw.h"

using rp::workers::SimdPath;

// One thread, vectorised (the kernel above reaches its speed on one thread as well).
__attribute__((noinline)) void Triad(float* __restrict a, const float* __restrict b, const float* __restrict c,
                                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 1.5f * c[i];
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int64_t n = 16 << 20;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Tensor p = at::randn({n}, gen, at::kFloat), g = at::randn({n}, gen, at::kFloat);
  at::Tensor m = at::zeros({n}), v = at::zeros({n});
  at::Tensor master = at::empty({n}, at::TensorOptions().dtype(at::kBFloat16));
  at::Tensor ref = p.clone().set_requires_grad(true);
  ref.mutable_grad() = g.clone();
  torch::optim::AdamW opt({ref}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));

  struct Row {
    std::string name;
    std::function<void()> fn;
    std::vector<double> t;
  };
  std::vector<Row> rows;
  rows.push_back({"torch::optim::AdamW (fp32 only)", [&] { opt.step(); }, {}});
  int64_t step = 0;
  for (SimdPath path : {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (!rp::workers::SimdPathSupported(path)) continue;
    for (int threads : {1, 2}) {
      const char* pn = path == SimdPath::kScalar ? "scalar" : path == SimdPath::kAvx2 ? "avx2" : "avx512";
      rows.push_back({std::string("fused ") + pn + ", " + std::to_string(threads) + " thread(s), + bf16 master",
                      [&, path, threads] {
                        rp::workers::AdamWBuffers b{p.data_ptr<float>(),
                                                    g.data_ptr<float>(),
                                                    m.data_ptr<float>(),
                                                    v.data_ptr<float>(),
                                                    nullptr,
                                                    master.data_ptr(),
                                                    rp::workers::MasterDtype::kBFloat16};
                        rp::workers::AdamWHyper h;
                        h.weight_decay = 0.01f;
                        h.step = ++step;
                        rp::workers::FusedAdamW(b, n, h, path, threads);
                      },
                      {}});
    }
  }
  // The machine's streaming bandwidth in this binary: a STREAM-style triad a = b + s*c over
  // 3 x n floats (read 2, write 1; counted as 12 B/element like STREAM), one thread.
  at::Tensor ta = at::empty({n}), tb = at::randn({n}, gen, at::kFloat), tc = at::randn({n}, gen, at::kFloat);
  rows.push_back({"triad a = b + s*c (bandwidth reference)",
                  [&] {
                    float* pa = ta.data_ptr<float>();
                    const float* pb = tb.data_ptr<float>();
                    const float* pc = tc.data_ptr<float>();
                    Triad(pa, pb, pc, n);
                  },
                  {}});
  for (int r = 0; r < rounds + 1; ++r) {
    for (Row& row : rows) {
      const auto t0 = std::chrono::steady_clock::now();
      row.fn();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) row.t.push_back(s);
    }
  }
  std::printf("AdamW over %lld fp32 parameters (best path here: %s), median of %d interleaved rounds\n",
              static_cast<long long>(n), rp::workers::BestSimdPathName().c_str(), rounds);
  std::printf("%-52s %10s %12s %10s %8s %10s\n", "kernel", "ms", "Mparam/s", "GB/s", "vs torch", "% of triad");
  double base = 0;
  const Row& triad = rows.back();
  std::vector<double> tt = triad.t;
  std::sort(tt.begin(), tt.end());
  const double triad_gbs = 3.0 * 4 * static_cast<double>(n) / tt[tt.size() / 2] / 1e9;
  for (Row& row : rows) {
    std::sort(row.t.begin(), row.t.end());
    const double t = row.t[row.t.size() / 2];
    if (base == 0) base = t;
    const bool is_triad = &row == &rows.back();
    // Bytes per parameter: the fused kernel reads p, g, m, v and writes p, m, v and the bf16
    // master (30 B); torch's multi-pass AdamW is charged the same useful bytes.
    const double bytes = static_cast<double>(n) * (is_triad ? 12 : 30);
    std::printf("%-52s %10.2f %12.0f %10.1f %7.2fx %9.0f%%\n", row.name.c_str(), t * 1e3, n / t / 1e6, bytes / t / 1e9,
                base / t, 100 * (bytes / t / 1e9) / triad_gbs);
  }
  return 0;
}
