// adamw_bench — the CPU optimizer step against PyTorch's own CPU AdamW paths and against the
// machine's measured memory bandwidth, side by side in one run, for several sizes (cache
// effects) and thread counts. A benchmark (a printed table), not a test.
//
//   build/tests/bench/adamw_bench [rounds=7] [sizes in Mi parameters=1,16,256] [threads=1,2]
//
// Rows per (size, threads), timed in interleaved rounds (median):
//   ours        FusedAdamW on the optimizer's own pool: reads p, g, m, v; writes p, m, v and the
//               bf16 master (30 B/param)
//   ours, bf16 moments  the same step with bf16 m and v (stochastic rounding): 22 B/param (the
//               AVX2 and scalar rows force the paths hosts without AVX-512 run)
//   torch fused ATen's _fused_adamw_ (what torch.optim.AdamW(fused=True) calls) on the intra-op
//               pool set to the same thread count: the same update, no master (28 B/param)
//   torch foreach  the multi-tensor path (torch.optim.AdamW(foreach=True)'s op sequence)
//   torch loop  torch::optim::AdamW, the per-tensor reference (sizes up to 16 Mi only)
//   ours SGD / Lion  the one-buffer kernels (cpu_momentum.h): p, g, buffer read; p, buffer and
//               the bf16 master written (22 B/param); torch fused SGD: _fused_sgd_, 20 B/param
//   ours Adafactor  cpu_adafactor.h on the parameter as a [n/4096, 4096] matrix: three passes
//               (p, g read; g read; p, g read, p and the bf16 master written: 26 B/param), state
//               of rows + columns only; torch Adafactor: torch.optim.Adafactor's per-tensor op
//               sequence (_single_tensor_adafactor) on the same matrix, no master; the AVX2 and
//               scalar rows force those paths of ours (what hosts without AVX-512 run; the
//               SGD and Lion AVX2 rows likewise)
//   triad       a = b + s*c on the same pool, streaming stores, 12 B/element
//   in place    p, m, v = x * 0.5 + g: the optimizer's own streams without its arithmetic, 28 B
// The measured bandwidth is the better of the last two, at the same thread count. "GB/s" counts
// the bytes each kernel must move (above); "% of bw" compares it with the measured bandwidth.
#include <sched.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "workers/optim/cpu_adafactor.h"
#include "workers/optim/cpu_adamw.h"
#include "workers/optim/cpu_momentum.h"
#include "workers/optim/optimizer_threads.h"

namespace {

using rp::workers::OptimizerThreads;

__attribute__((target("avx512f"))) void TriadAvx512(float* a, const float* b, const float* c, int64_t begin,
                                                    int64_t end) {
  const __m512 s = _mm512_set1_ps(1.5f);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16)
    _mm512_stream_ps(a + i, _mm512_fmadd_ps(s, _mm512_loadu_ps(c + i), _mm512_loadu_ps(b + i)));
  for (; i < end; ++i) a[i] = b[i] + 1.5f * c[i];
  _mm_sfence();
}

void TriadPlain(float* a, const float* b, const float* c, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) a[i] = b[i] + 1.5f * c[i];
}

// The optimizer's own access pattern without its arithmetic: read p, g, m, v, write p, m, v in
// place (28 B/element), vectorised like the kernel. The ceiling a one-pass in-place optimizer
// can reach on this machine.
__attribute__((target("avx512f"))) void InPlaceStreamsAvx512(float* p, const float* g, float* m, float* v,
                                                             int64_t begin, int64_t end) {
  const __m512 h = _mm512_set1_ps(0.5f);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    _mm512_storeu_ps(p + i, _mm512_fmadd_ps(_mm512_loadu_ps(p + i), h, x));
    _mm512_storeu_ps(m + i, _mm512_fmadd_ps(_mm512_loadu_ps(m + i), h, x));
    _mm512_storeu_ps(v + i, _mm512_fmadd_ps(_mm512_loadu_ps(v + i), h, x));
  }
  for (; i < end; ++i) p[i] = p[i] * 0.5f + g[i], m[i] = m[i] * 0.5f + g[i], v[i] = v[i] * 0.5f + g[i];
}

void InPlaceStreamsPlain(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) p[i] = p[i] * 0.5f + g[i], m[i] = m[i] * 0.5f + g[i], v[i] = v[i] * 0.5f + g[i];
}

std::vector<int64_t> ParseList(const char* s, std::vector<int64_t> dflt) {
  if (s == nullptr) return dflt;
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::atoll(item.c_str()));
  return out;
}

struct Row {
  std::string name;
  double bytes_per_param;
  std::function<void()> fn;
  std::vector<double> t;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void RunSize(int64_t n, int threads, int rounds) {
  at::set_num_threads(threads);
  OptimizerThreads pool(threads);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Tensor p = at::randn({n}, gen, at::kFloat), g = at::randn({n}, gen, at::kFloat) * 0.1;
  at::Tensor m = at::zeros({n}), v = at::zeros({n});
  at::Tensor master = at::empty({n}, at::TensorOptions().dtype(at::kBFloat16));
  // torch's paths get their own tensors (same values), so every kernel sees sane magnitudes.
  at::Tensor tp = p.clone(), tg = g.clone(), tm = m.clone(), tv = v.clone();
  at::Tensor step_t = at::zeros({}, at::kFloat);
  at::Tensor ta = at::empty({n});
  std::vector<Row> rows;
  // Our fused step on p, m, v (+ the bf16 master) with `pool`, its own step count in `step`.
  auto ours = [&](OptimizerThreads* on, int64_t* step) {
    rp::workers::AdamWBuffers b{p.data_ptr<float>(),
                                g.data_ptr<float>(),
                                m.data_ptr<float>(),
                                v.data_ptr<float>(),
                                nullptr,
                                master.data_ptr(),
                                rp::workers::MasterDtype::kBFloat16};
    rp::workers::AdamWHyper h;
    h.weight_decay = 0.01f;
    h.step = ++*step;
    rp::workers::FusedAdamW(b, n, h, rp::workers::SimdPath::kAuto, on);
  };
  int64_t step = 0;
  rows.push_back({"ours (fused + bf16 master, own pool)", 30, [&] { ours(&pool, &step); }});
  // The same kernel with the pool's helpers pinned to their own cores and the caller to the
  // first (OptimizerThreads' pin_helpers): does pinning pay? Same tensors (no more memory at
  // 256 Mi), its own step count.
  OptimizerThreads pinned_pool(threads, /*pin_helpers=*/true);
  int64_t step_p = 0;
  rows.push_back({"ours, threads pinned to cores", 30, [&] {
                    cpu_set_t before, first;
                    sched_getaffinity(0, sizeof(before), &before);
                    CPU_ZERO(&first);
                    for (int c = 0; c < CPU_SETSIZE; ++c) {
                      if (CPU_ISSET(c, &before)) {
                        CPU_SET(c, &first);
                        break;
                      }
                    }
                    sched_setaffinity(0, sizeof(first), &first);
                    ours(&pinned_pool, &step_p);
                    sched_setaffinity(0, sizeof(before), &before);
                  }});
  at::Tensor mb = at::zeros({n}, at::kBFloat16), vb = at::zeros({n}, at::kBFloat16);
  at::Tensor pb = p.clone();
  int64_t step_b = 0;
  auto bf16_moments = [&](rp::workers::SimdPath path) {
    return [&, path] {
      rp::workers::AdamWBf16MomentBuffers b{pb.data_ptr<float>(),
                                            g.data_ptr<float>(),
                                            static_cast<uint16_t*>(mb.data_ptr()),
                                            static_cast<uint16_t*>(vb.data_ptr()),
                                            master.data_ptr(),
                                            rp::workers::MasterDtype::kBFloat16};
      rp::workers::AdamWHyper h;
      h.weight_decay = 0.01f;
      h.step = ++step_b;
      rp::workers::FusedAdamWBf16Moments(b, n, h, /*seed=*/1, path, &pool);
    };
  };
  rows.push_back({"ours, bf16 moments (stochastic rounding)", 22, bf16_moments(rp::workers::SimdPath::kAuto)});
  if (rp::workers::SimdPathSupported(rp::workers::SimdPath::kAvx2)) {
    rows.push_back({"ours, bf16 moments, AVX2 path", 22, bf16_moments(rp::workers::SimdPath::kAvx2)});
  }
  rows.push_back({"ours, bf16 moments, scalar path", 22, bf16_moments(rp::workers::SimdPath::kScalar)});
  rows.push_back({"torch fused (_fused_adamw_)", 28, [&] {
                    step_t.add_(1);
                    at::_fused_adamw_({tp}, {tg}, {tm}, {tv}, {}, {step_t}, 1e-3, 0.9, 0.999, 0.01, 1e-8, false, false);
                  }});
  int64_t fe_step = 0;
  rows.push_back({"torch foreach (multi-tensor ops)", 28, [&] {
                    // torch.optim.adamw._multi_tensor_adamw, one tensor in the list.
                    ++fe_step;
                    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, wd = 0.01, eps = 1e-8;
                    at::_foreach_mul_({tp}, 1 - lr * wd);
                    at::_foreach_lerp_({tm}, {tg}, 1 - b1);
                    at::_foreach_mul_({tv}, b2);
                    at::_foreach_addcmul_({tv}, {tg}, {tg}, 1 - b2);
                    const double bc1 = 1 - std::pow(b1, fe_step), bc2 = 1 - std::pow(b2, fe_step);
                    auto denom = at::_foreach_sqrt({tv});
                    at::_foreach_div_(denom, std::sqrt(bc2));
                    at::_foreach_add_(denom, eps);
                    at::_foreach_addcdiv_({tp}, {tm}, denom, -lr / bc1);
                  }});
  std::optional<torch::optim::AdamW> loop;
  at::Tensor lp;
  if (n <= (int64_t{16} << 20)) {
    lp = tp.clone().set_requires_grad(true);
    lp.mutable_grad() = tg.clone();
    loop.emplace(std::vector<at::Tensor>{lp}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
    rows.push_back({"torch loop (torch::optim::AdamW)", 28, [&] { loop->step(); }});
  }
  // The one-buffer optimizers (cpu_momentum.h) beside torch's fused SGD.
  // Every row below steps buffers of the rows above (parameters, moments: sane magnitudes), so
  // 256 Mi fits in 24 GB; only the times matter here, the values are tested elsewhere.
  at::Tensor sgd_p = p, sbuf = m, lp2 = p, lbuf = v;
  at::Tensor tsp = tp, tsbuf = tm;
  bool sgd_first = true, torch_sgd_first = true;
  auto sgd = [&](rp::workers::SimdPath path) {
    return [&, path] {
      rp::workers::MomentumBuffers b{sgd_p.data_ptr<float>(), g.data_ptr<float>(), sbuf.data_ptr<float>(),
                                     master.data_ptr(), rp::workers::MasterDtype::kBFloat16};
      rp::workers::SgdHyper h;
      h.lr = 1e-3f;
      h.momentum = 0.9f;
      h.first_step = sgd_first;
      sgd_first = false;
      rp::workers::FusedSgd(b, n, h, path, &pool);
    };
  };
  rows.push_back({"ours SGD momentum 0.9 (+ bf16 master)", 22, sgd(rp::workers::SimdPath::kAuto)});
  if (rp::workers::SimdPathSupported(rp::workers::SimdPath::kAvx2)) {
    rows.push_back({"ours SGD momentum, AVX2 path", 22, sgd(rp::workers::SimdPath::kAvx2)});
  }
  rows.push_back({"torch fused SGD momentum 0.9 (_fused_sgd_)", 20, [&] {
                    at::_fused_sgd_({tsp}, {tg}, {tsbuf}, 0.0, 0.9, 1e-3, 0.0, false, false, torch_sgd_first);
                    torch_sgd_first = false;
                  }});
  auto lion = [&](rp::workers::SimdPath path) {
    return [&, path] {
      rp::workers::MomentumBuffers b{lp2.data_ptr<float>(), g.data_ptr<float>(), lbuf.data_ptr<float>(),
                                     master.data_ptr(), rp::workers::MasterDtype::kBFloat16};
      rp::workers::LionHyper h;
      h.weight_decay = 0.01f;
      rp::workers::FusedLion(b, n, h, path, &pool);
    };
  };
  rows.push_back({"ours Lion (+ bf16 master)", 22, lion(rp::workers::SimdPath::kAuto)});
  if (rp::workers::SimdPathSupported(rp::workers::SimdPath::kAvx2)) {
    rows.push_back({"ours Lion, AVX2 path", 22, lion(rp::workers::SimdPath::kAvx2)});
  }
  // Adafactor on the same values as a matrix (the factored case every weight matrix takes).
  const int64_t af_cols = 4096, af_rows = n / af_cols;
  at::Tensor afp = p, af_row = at::zeros({af_rows, 1}), af_col = at::zeros({1, af_cols});
  int64_t af_step = 0;
  auto adafactor = [&](rp::workers::SimdPath path) {
    return [&, path] {
      rp::workers::AdafactorBuffers b;
      b.param = afp.data_ptr<float>();
      b.grad = g.data_ptr<float>();
      b.row_var = af_row.data_ptr<float>();
      b.col_var = af_col.data_ptr<float>();
      b.master = master.data_ptr();
      b.master_dtype = rp::workers::MasterDtype::kBFloat16;
      rp::workers::AdafactorShape s;
      s.rows = af_rows;
      s.cols = af_cols;
      rp::workers::AdafactorHyper h;
      h.step = ++af_step;
      rp::workers::FusedAdafactor(b, s, h, path, &pool);
    };
  };
  rows.push_back({"ours Adafactor (+ bf16 master)", 26, adafactor(rp::workers::SimdPath::kAuto)});
  if (rp::workers::SimdPathSupported(rp::workers::SimdPath::kAvx2)) {
    rows.push_back({"ours Adafactor, AVX2 path", 26, adafactor(rp::workers::SimdPath::kAvx2)});
  }
  rows.push_back({"ours Adafactor, scalar path", 26, adafactor(rp::workers::SimdPath::kScalar)});
  at::Tensor tafp = tp.view({af_rows, af_cols}), tafg = tg.view({af_rows, af_cols});
  at::Tensor taf_row = at::zeros({af_rows, 1}), taf_col = at::zeros({1, af_cols});
  int64_t taf_step = 0;
  rows.push_back({"torch Adafactor (its op sequence)", 26, [&] {
                    const double t = static_cast<double>(++taf_step), lr = 1e-2;
                    const double beta = std::pow(t, -0.8), rho = std::min(lr, 1 / std::sqrt(t));
                    const double eps1 = 1.1920928955078125e-07;
                    const double alpha = std::max(1e-3, tafp.norm().item<double>() / std::sqrt(double(n))) * rho;
                    taf_row.lerp_(at::linalg_vector_norm(tafg, 2, {-1}, true).square_().div_(af_cols), beta);
                    taf_col.lerp_(at::linalg_vector_norm(tafg, 2, {-2}, true).square_().div_(af_rows), beta);
                    at::Tensor var = at::matmul(taf_row, taf_col);
                    var.div_(taf_row.mean({-2}, true).clamp_(eps1));
                    at::Tensor update = var.clamp_(eps1 * eps1).rsqrt_().mul_(tafg);
                    const double denom = std::max(1.0, update.norm().item<double>() / std::sqrt(double(n)));
                    tafp.add_(update, -alpha / denom);
                  }});
  const bool avx512 = rp::workers::SimdPathSupported(rp::workers::SimdPath::kAvx512);
  rows.push_back({"triad a = b + s*c (bandwidth, same pool)", 12, [&] {
                    float* pa = ta.data_ptr<float>();
                    const float* pb = tp.data_ptr<float>();
                    const float* pc = tg.data_ptr<float>();
                    pool.ParallelFor(n, 64, threads, [&](int64_t b, int64_t e) {
                      if (avx512) {
                        TriadAvx512(pa, pb, pc, b, e);
                      } else {
                        TriadPlain(pa, pb, pc, b, e);
                      }
                    });
                  }});
  at::Tensor sp = p, sm = m, sv = v;
  rows.push_back({"in place p,m,v += g (bandwidth, same pool)", 28, [&] {
                    pool.ParallelFor(n, 64, threads, [&](int64_t b, int64_t e) {
                      auto* f = avx512 ? InPlaceStreamsAvx512 : InPlaceStreamsPlain;
                      f(sp.data_ptr<float>(), tg.data_ptr<float>(), sm.data_ptr<float>(), sv.data_ptr<float>(), b, e);
                    });
                  }});
  for (int r = 0; r < rounds + 1; ++r) {
    for (Row& row : rows) {
      const auto t0 = std::chrono::steady_clock::now();
      row.fn();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) row.t.push_back(s);  // round 0 warms pages and caches
    }
  }
  // The measured bandwidth: the better of the two references (the rows at the end).
  const double triad_gbs = 12.0 * static_cast<double>(n) / Median(rows[rows.size() - 2].t) / 1e9;
  const double inplace_gbs = 28.0 * static_cast<double>(n) / Median(rows.back().t) / 1e9;
  const double bw = std::max(triad_gbs, inplace_gbs);
  const auto fused = std::find_if(rows.begin(), rows.end(),
                                  [](const Row& r) { return std::string(r.name).rfind("torch fused (", 0) == 0; });
  const double fused_t = Median(fused->t);
  std::printf("\n%lld Mi parameters, %d thread(s), median of %d rounds (bandwidth %.1f GB/s)\n",
              static_cast<long long>(n >> 20), threads, rounds, bw);
  std::printf("%-44s %9s %10s %8s %9s %8s\n", "kernel", "ms", "Mparam/s", "GB/s", "vs fused", "% of bw");
  for (Row& row : rows) {
    const double t = Median(row.t);
    const double gbs = row.bytes_per_param * static_cast<double>(n) / t / 1e9;
    std::printf("%-44s %9.2f %10.0f %8.1f %8.2fx %7.0f%%\n", row.name.c_str(), t * 1e3,
                static_cast<double>(n) / t / 1e6, gbs, fused_t / t, 100 * gbs / bw);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const std::vector<int64_t> sizes = ParseList(argc > 2 ? argv[2] : nullptr, {1, 16, 256});
  const std::vector<int64_t> threads = ParseList(argc > 3 ? argv[3] : nullptr, {1, 2});
  std::printf("CPU AdamW step (best SIMD path here: %s)\n", rp::workers::BestSimdPathName().c_str());
  for (int64_t mi : sizes) {
    for (int64_t t : threads) RunSize(mi << 20, static_cast<int>(t), rounds);
  }
  return 0;
}
