#include "workers/optim/cpu_adafactor.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "workers/base/mutex.h"
#include "workers/optim/simd_master.h"

namespace rp::workers {
namespace {

constexpr int64_t kMinElementsPerSlice = 1 << 14;
// Column sums of squares are gathered in float over this many rows, then added in double.
constexpr int64_t kColumnFlushRows = 256;

// fn(begin, end) over [0, units) (each unit `unit_elements` long) in slices on the pool; the
// slices' results come back in unit order, so combining them is deterministic.
template <typename R, typename Fn>
std::vector<R> SlicedInOrder(int64_t units, int64_t unit_elements, OptimizerThreads* pool, Fn&& fn) {
  const int64_t n = units * unit_elements;
  if (pool == nullptr || pool->size() < 2 || units < 2 || n < 2 * kMinElementsPerSlice) return {fn(0, units)};
  base::Mutex mu;
  std::map<int64_t, R> parts;  // under mu
  pool->ParallelFor(units, 1, std::max<int64_t>(1, n / kMinElementsPerSlice), [&](int64_t begin, int64_t end) {
    R r = fn(begin, end);
    base::MutexLock lock(&mu);
    parts.emplace(begin, std::move(r));
  });
  std::vector<R> out;
  base::MutexLock lock(&mu);
  for (auto& [begin, r] : parts) out.push_back(std::move(r));
  return out;
}

// torch's lerp for a float tensor: self + w (end - self) for w < 0.5, else end - (end - self)(1 - w).
inline float Lerp(float self, float end, float w) {
  return w < 0.5f ? self + w * (end - self) : end - (end - self) * (1.0f - w);
}

struct Sums {
  double param_sq = 0;
  std::vector<double> col_sq;  // factored: [batch, cols], this slice's rows only
};

// A factored parameter's update g * rsqrt(max(r_u * c_j / mean(r), eps1^2)), from per-row and
// per-column factors: cs_j = c_j / mean(r) of its batch, and where the product clears the floor
// the inverse square root as (1/sqrt(r_u)) (1/sqrt(cs_j)) — within an ulp or two of torch's
// rsqrt of the product — else 1/eps1.
struct Factors {
  std::vector<float> inv_sqrt_row;  // [units]
  std::vector<float> col_scaled;    // [batch, cols]
  std::vector<float> inv_sqrt_col;  // [batch, cols]
  float eps_sq = 0, inv_eps = 0;
};

inline float UpdateScale(float row, float inv_row, float col, float inv_col, const Factors& f) {
  return row * col >= f.eps_sq ? inv_row * inv_col : f.inv_eps;
}

// ---- the factored passes over rows [u0, u1), scalar
// Row u from column c0 on: its parameter and gradient sums of squares (added to psq, rsq) and
// the gradient's squares into the row's column sums; then, with the row's whole sums, its
// second-moment row (FinishRow).
void SumsRowScalar(const AdafactorBuffers& b, const AdafactorShape& s, float gscale, int64_t u, int64_t c0, float* colf,
                   double& psq, double& rsq) {
  const float* p = b.param + u * s.cols;
  const float* g = b.grad + u * s.cols;
  float* col = colf + (u / s.rows) * s.cols;
  for (int64_t c = c0; c < s.cols; ++c) {
    const float gv = g[c] * gscale;
    psq += static_cast<double>(p[c]) * p[c];
    rsq += static_cast<double>(gv) * gv;
    col[c] += gv * gv;
  }
}
void FinishRow(const AdafactorBuffers& b, const AdafactorShape& s, float beta, int64_t u, double psq, double rsq,
               Sums& out) {
  out.param_sq += psq;
  b.row_var[u] = Lerp(b.row_var[u], static_cast<float>(rsq / static_cast<double>(s.cols)), beta);
}
void SumsRowsScalar(const AdafactorBuffers& b, const AdafactorShape& s, float gscale, float beta, int64_t u0,
                    int64_t u1, Sums& out, float* colf) {
  for (int64_t u = u0; u < u1; ++u) {
    double psq = 0, rsq = 0;
    SumsRowScalar(b, s, gscale, u, 0, colf, psq, rsq);
    FinishRow(b, s, beta, u, psq, rsq, out);
  }
}

double UpdateSquaresScalar(const AdafactorBuffers& b, const AdafactorShape& s, float gscale, const Factors& f,
                           int64_t u, int64_t c0) {
  const float* g = b.grad + u * s.cols;
  const int64_t k = u / s.rows;
  const float* cs = f.col_scaled.data() + k * s.cols;
  const float* ics = f.inv_sqrt_col.data() + k * s.cols;
  double sum = 0;
  for (int64_t c = c0; c < s.cols; ++c) {
    const float x = g[c] * gscale * UpdateScale(b.row_var[u], f.inv_sqrt_row[static_cast<size_t>(u)], cs[c], ics[c], f);
    sum += static_cast<double>(x) * x;
  }
  return sum;
}

void ApplyScalar(const AdafactorBuffers& b, const AdafactorShape& s, float gscale, const Factors& f, float decay,
                 bool decays, float step, int64_t u, int64_t c0) {
  float* p = b.param + u * s.cols;
  const float* g = b.grad + u * s.cols;
  const int64_t k = u / s.rows;
  const float* cs = f.col_scaled.data() + k * s.cols;
  const float* ics = f.inv_sqrt_col.data() + k * s.cols;
  for (int64_t c = c0; c < s.cols; ++c) {
    const float x = g[c] * gscale * UpdateScale(b.row_var[u], f.inv_sqrt_row[static_cast<size_t>(u)], cs[c], ics[c], f);
    float v = decays ? p[c] * decay : p[c];
    v = v + step * x;
    p[c] = v;
    StoreMaster(b.master, b.master_dtype, u * s.cols + c, v);
  }
}

// ---- the same passes 16 columns at a time (AVX-512), the scalar loop for each row's tail
__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"))) void SumsRowsAvx512(const AdafactorBuffers& b,
                                                                              const AdafactorShape& s, float gscale,
                                                                              float beta, int64_t u0, int64_t u1,
                                                                              Sums& out, float* colf) {
  const __m512 gs = _mm512_set1_ps(gscale);
  for (int64_t u = u0; u < u1; ++u) {
    const float* p = b.param + u * s.cols;
    const float* g = b.grad + u * s.cols;
    float* col = colf + (u / s.rows) * s.cols;
    __m512 ap = _mm512_setzero_ps(), ag = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= s.cols; c += 16) {
      const __m512 pv = _mm512_loadu_ps(p + c);
      const __m512 gv = _mm512_mul_ps(_mm512_loadu_ps(g + c), gs);
      const __m512 g2 = _mm512_mul_ps(gv, gv);
      ap = _mm512_fmadd_ps(pv, pv, ap);
      ag = _mm512_add_ps(ag, g2);
      _mm512_storeu_ps(col + c, _mm512_add_ps(_mm512_loadu_ps(col + c), g2));
    }
    double psq = _mm512_reduce_add_ps(ap), rsq = _mm512_reduce_add_ps(ag);
    SumsRowScalar(b, s, gscale, u, c, colf, psq, rsq);
    FinishRow(b, s, beta, u, psq, rsq, out);
  }
}

// The update's 16 values at column c of row u.
__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"))) inline __m512 Update16(const float* g, const float* cs,
                                                                                 const float* ics, int64_t c, __m512 gs,
                                                                                 __m512 row, __m512 inv_row,
                                                                                 __m512 eps_sq, __m512 inv_eps) {
  const __m512 prod = _mm512_mul_ps(row, _mm512_loadu_ps(cs + c));
  const __mmask16 above = _mm512_cmp_ps_mask(prod, eps_sq, _CMP_GE_OQ);
  const __m512 scale = _mm512_mask_blend_ps(above, inv_eps, _mm512_mul_ps(inv_row, _mm512_loadu_ps(ics + c)));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(g + c), gs), scale);
}

__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"))) double UpdateSquaresRowsAvx512(const AdafactorBuffers& b,
                                                                                         const AdafactorShape& s,
                                                                                         float gscale, const Factors& f,
                                                                                         int64_t u0, int64_t u1) {
  const __m512 gs = _mm512_set1_ps(gscale), eps_sq = _mm512_set1_ps(f.eps_sq), inv_eps = _mm512_set1_ps(f.inv_eps);
  double sum = 0;
  for (int64_t u = u0; u < u1; ++u) {
    const float* g = b.grad + u * s.cols;
    const int64_t k = u / s.rows;
    const float* cs = f.col_scaled.data() + k * s.cols;
    const float* ics = f.inv_sqrt_col.data() + k * s.cols;
    const __m512 row = _mm512_set1_ps(b.row_var[u]), inv_row = _mm512_set1_ps(f.inv_sqrt_row[static_cast<size_t>(u)]);
    __m512 acc = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= s.cols; c += 16) {
      const __m512 x = Update16(g, cs, ics, c, gs, row, inv_row, eps_sq, inv_eps);
      acc = _mm512_fmadd_ps(x, x, acc);
    }
    sum += _mm512_reduce_add_ps(acc);
    sum += UpdateSquaresScalar(b, s, gscale, f, u, c);
  }
  return sum;
}

__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"))) void ApplyRowsAvx512(const AdafactorBuffers& b,
                                                                               const AdafactorShape& s, float gscale,
                                                                               const Factors& f, float decay,
                                                                               bool decays, float step, int64_t u0,
                                                                               int64_t u1) {
  const __m512 gs = _mm512_set1_ps(gscale), eps_sq = _mm512_set1_ps(f.eps_sq), inv_eps = _mm512_set1_ps(f.inv_eps);
  const __m512 dv = _mm512_set1_ps(decay), sv = _mm512_set1_ps(step);
  for (int64_t u = u0; u < u1; ++u) {
    float* p = b.param + u * s.cols;
    const float* g = b.grad + u * s.cols;
    const int64_t k = u / s.rows;
    const float* cs = f.col_scaled.data() + k * s.cols;
    const float* ics = f.inv_sqrt_col.data() + k * s.cols;
    const __m512 row = _mm512_set1_ps(b.row_var[u]), inv_row = _mm512_set1_ps(f.inv_sqrt_row[static_cast<size_t>(u)]);
    int64_t c = 0;
    for (; c + 16 <= s.cols; c += 16) {
      const __m512 x = Update16(g, cs, ics, c, gs, row, inv_row, eps_sq, inv_eps);
      __m512 v = _mm512_loadu_ps(p + c);
      if (decays) v = _mm512_mul_ps(v, dv);
      v = _mm512_add_ps(v, _mm512_mul_ps(sv, x));  // not fused: the scalar loop's rounding
      _mm512_storeu_ps(p + c, v);
      StoreMaster16(b.master, b.master_dtype, u * s.cols + c, v, /*stream=*/false);
    }
    ApplyScalar(b, s, gscale, f, decay, decays, step, u, c);
  }
}

// ---- the same passes 8 columns at a time (AVX2), for hosts without AVX-512
__attribute__((target("avx2,fma"))) inline double Sum8(__m256 x) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}

__attribute__((target("avx2,fma,f16c"))) void SumsRowsAvx2(const AdafactorBuffers& b, const AdafactorShape& s,
                                                           float gscale, float beta, int64_t u0, int64_t u1, Sums& out,
                                                           float* colf) {
  const __m256 gs = _mm256_set1_ps(gscale);
  for (int64_t u = u0; u < u1; ++u) {
    const float* p = b.param + u * s.cols;
    const float* g = b.grad + u * s.cols;
    float* col = colf + (u / s.rows) * s.cols;
    __m256 ap = _mm256_setzero_ps(), ag = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= s.cols; c += 8) {
      const __m256 pv = _mm256_loadu_ps(p + c);
      const __m256 gv = _mm256_mul_ps(_mm256_loadu_ps(g + c), gs);
      const __m256 g2 = _mm256_mul_ps(gv, gv);
      ap = _mm256_fmadd_ps(pv, pv, ap);
      ag = _mm256_add_ps(ag, g2);
      _mm256_storeu_ps(col + c, _mm256_add_ps(_mm256_loadu_ps(col + c), g2));
    }
    double psq = Sum8(ap), rsq = Sum8(ag);
    SumsRowScalar(b, s, gscale, u, c, colf, psq, rsq);
    FinishRow(b, s, beta, u, psq, rsq, out);
  }
}

// The update's 8 values at column c of row u.
__attribute__((target("avx2,fma"))) inline __m256 Update8(const float* g, const float* cs, const float* ics, int64_t c,
                                                          __m256 gs, __m256 row, __m256 inv_row, __m256 eps_sq,
                                                          __m256 inv_eps) {
  const __m256 above = _mm256_cmp_ps(_mm256_mul_ps(row, _mm256_loadu_ps(cs + c)), eps_sq, _CMP_GE_OQ);
  const __m256 scale = _mm256_blendv_ps(inv_eps, _mm256_mul_ps(inv_row, _mm256_loadu_ps(ics + c)), above);
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(g + c), gs), scale);
}

// A row's per-column factors, as the row loops of both AVX2 passes read them.
struct RowFactors {
  const float* g;
  const float* cs;
  const float* ics;
  __m256 row, inv_row;
};
__attribute__((target("avx2,fma"))) inline RowFactors RowOf(const AdafactorBuffers& b, const AdafactorShape& s,
                                                            const Factors& f, int64_t u) {
  const int64_t k = u / s.rows;
  return {b.grad + u * s.cols, f.col_scaled.data() + k * s.cols, f.inv_sqrt_col.data() + k * s.cols,
          _mm256_set1_ps(b.row_var[u]), _mm256_set1_ps(f.inv_sqrt_row[static_cast<size_t>(u)])};
}

__attribute__((target("avx2,fma,f16c"))) double UpdateSquaresRowsAvx2(const AdafactorBuffers& b,
                                                                      const AdafactorShape& s, float gscale,
                                                                      const Factors& f, int64_t u0, int64_t u1) {
  const __m256 gs = _mm256_set1_ps(gscale), eps_sq = _mm256_set1_ps(f.eps_sq), inv_eps = _mm256_set1_ps(f.inv_eps);
  double sum = 0;
  for (int64_t u = u0; u < u1; ++u) {
    const RowFactors r = RowOf(b, s, f, u);
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= s.cols; c += 8) {
      const __m256 x = Update8(r.g, r.cs, r.ics, c, gs, r.row, r.inv_row, eps_sq, inv_eps);
      acc = _mm256_fmadd_ps(x, x, acc);
    }
    sum += Sum8(acc);
    sum += UpdateSquaresScalar(b, s, gscale, f, u, c);
  }
  return sum;
}

__attribute__((target("avx2,fma,f16c"))) void ApplyRowsAvx2(const AdafactorBuffers& b, const AdafactorShape& s,
                                                            float gscale, const Factors& f, float decay, bool decays,
                                                            float step, int64_t u0, int64_t u1) {
  const __m256 gs = _mm256_set1_ps(gscale), eps_sq = _mm256_set1_ps(f.eps_sq), inv_eps = _mm256_set1_ps(f.inv_eps);
  const __m256 dv = _mm256_set1_ps(decay), sv = _mm256_set1_ps(step);
  for (int64_t u = u0; u < u1; ++u) {
    float* p = b.param + u * s.cols;
    const RowFactors r = RowOf(b, s, f, u);
    int64_t c = 0;
    for (; c + 8 <= s.cols; c += 8) {
      const __m256 x = Update8(r.g, r.cs, r.ics, c, gs, r.row, r.inv_row, eps_sq, inv_eps);
      __m256 v = _mm256_loadu_ps(p + c);
      if (decays) v = _mm256_mul_ps(v, dv);
      v = _mm256_add_ps(v, _mm256_mul_ps(sv, x));  // not fused: the scalar loop's rounding
      _mm256_storeu_ps(p + c, v);
      StoreMaster8(b.master, b.master_dtype, u * s.cols + c, v);
    }
    ApplyScalar(b, s, gscale, f, decay, decays, step, u, c);
  }
}

// One step's fixed inputs, shared by its three passes.
struct Pass {
  const AdafactorBuffers& b;
  const AdafactorShape& s;
  OptimizerThreads* pool;
  bool factored;
  SimdPath simd;  // resolved: kScalar, kAvx2 or kAvx512
  float gscale, beta;
  int64_t units, unit_len;  // factored: rows of `cols`; unfactored: single elements
};

// (1) The parameter's sum of squares (returned); the gradient's row means lerped into row_var
// and its column means into col_var (or the full variance), and from them the update's factors.
double SumSquaresPass(const Pass& p, float eps1, Factors& f) {
  const AdafactorBuffers& b = p.b;
  const AdafactorShape& s = p.s;
  std::vector<Sums> parts = SlicedInOrder<Sums>(p.units, p.unit_len, p.pool, [&](int64_t u0, int64_t u1) {
    Sums out;
    if (!p.factored) {
      for (int64_t u = u0; u < u1; ++u) {
        out.param_sq += static_cast<double>(b.param[u]) * b.param[u];
        const float gv = b.grad[u] * p.gscale;
        b.variance[u] = Lerp(b.variance[u], gv * gv, p.beta);
      }
      return out;
    }
    const size_t width = static_cast<size_t>(s.batch * s.cols);
    out.col_sq.assign(width, 0.0);
    std::vector<float> colf(width, 0.0f);
    for (int64_t r0 = u0; r0 < u1; r0 += kColumnFlushRows) {
      const int64_t r1 = std::min(u1, r0 + kColumnFlushRows);
      if (p.simd == SimdPath::kAvx512) {
        SumsRowsAvx512(b, s, p.gscale, p.beta, r0, r1, out, colf.data());
      } else if (p.simd == SimdPath::kAvx2) {
        SumsRowsAvx2(b, s, p.gscale, p.beta, r0, r1, out, colf.data());
      } else {
        SumsRowsScalar(b, s, p.gscale, p.beta, r0, r1, out, colf.data());
      }
      for (size_t j = 0; j < width; ++j) {  // flush the float column sums into double
        out.col_sq[j] += colf[j];
        colf[j] = 0;
      }
    }
    return out;
  });
  double param_sq = 0;
  for (const Sums& part : parts) param_sq += part.param_sq;
  if (!p.factored) return param_sq;
  f.col_scaled.resize(static_cast<size_t>(s.batch * s.cols));
  f.inv_sqrt_col.resize(f.col_scaled.size());
  for (int64_t k = 0; k < s.batch; ++k) {
    double sum = 0;
    for (int64_t r = 0; r < s.rows; ++r) sum += b.row_var[k * s.rows + r];
    const float mean = std::max(static_cast<float>(sum / static_cast<double>(s.rows)), eps1);
    for (int64_t c = 0; c < s.cols; ++c) {
      const size_t i = static_cast<size_t>(k * s.cols + c);
      double sq = 0;
      for (const Sums& part : parts) sq += part.col_sq[i];
      b.col_var[i] = Lerp(b.col_var[i], static_cast<float>(sq / static_cast<double>(s.rows)), p.beta);
      f.col_scaled[i] = b.col_var[i] / mean;
      f.inv_sqrt_col[i] = 1.0f / std::sqrt(f.col_scaled[i]);
    }
  }
  f.inv_sqrt_row.resize(static_cast<size_t>(p.units));
  for (int64_t u = 0; u < p.units; ++u) f.inv_sqrt_row[static_cast<size_t>(u)] = 1.0f / std::sqrt(b.row_var[u]);
  return param_sq;
}

// An unfactored element's update.
inline float UnfactoredUpdate(const Pass& p, const Factors& f, int64_t u) {
  return p.b.grad[u] * p.gscale / std::sqrt(std::max(p.b.variance[u], f.eps_sq));
}

// (2) The update's sum of squares (its RMS clipping).
double UpdateSquaresPass(const Pass& p, const Factors& f) {
  std::vector<double> parts = SlicedInOrder<double>(p.units, p.unit_len, p.pool, [&](int64_t u0, int64_t u1) {
    double sum = 0;
    if (!p.factored) {
      for (int64_t u = u0; u < u1; ++u) {
        const double x = UnfactoredUpdate(p, f, u);
        sum += x * x;
      }
    } else if (p.simd == SimdPath::kAvx512) {
      sum = UpdateSquaresRowsAvx512(p.b, p.s, p.gscale, f, u0, u1);
    } else if (p.simd == SimdPath::kAvx2) {
      sum = UpdateSquaresRowsAvx2(p.b, p.s, p.gscale, f, u0, u1);
    } else {
      for (int64_t u = u0; u < u1; ++u) sum += UpdateSquaresScalar(p.b, p.s, p.gscale, f, u, 0);
    }
    return sum;
  });
  double sum = 0;
  for (double x : parts) sum += x;
  return sum;
}

// (3) Decay, step, master.
void ApplyPass(const Pass& p, const Factors& f, float decay, bool decays, float step) {
  SlicedInOrder<int>(p.units, p.unit_len, p.pool, [&](int64_t u0, int64_t u1) {
    if (!p.factored) {
      for (int64_t u = u0; u < u1; ++u) {
        float v = decays ? p.b.param[u] * decay : p.b.param[u];
        v = v + step * UnfactoredUpdate(p, f, u);
        p.b.param[u] = v;
        StoreMaster(p.b.master, p.b.master_dtype, u, v);
      }
    } else if (p.simd == SimdPath::kAvx512) {
      ApplyRowsAvx512(p.b, p.s, p.gscale, f, decay, decays, step, u0, u1);
    } else if (p.simd == SimdPath::kAvx2) {
      ApplyRowsAvx2(p.b, p.s, p.gscale, f, decay, decays, step, u0, u1);
    } else {
      for (int64_t u = u0; u < u1; ++u) ApplyScalar(p.b, p.s, p.gscale, f, decay, decays, step, u, 0);
    }
    return 0;
  });
}
}  // namespace

void FusedAdafactor(const AdafactorBuffers& b, const AdafactorShape& s, const AdafactorHyper& h, SimdPath path,
                    OptimizerThreads* pool) {
  const int64_t n = s.numel();
  if (n <= 0) return;
  const bool factored = s.rows > 0;
  const double t = static_cast<double>(h.step);
  const float eps1 = h.eps1 > 0 ? static_cast<float>(h.eps1) : std::numeric_limits<float>::epsilon();
  const Pass p{b,
               s,
               pool,
               factored,
               ResolveSimdPath(path),
               h.maximize ? -h.grad_scale : h.grad_scale,
               static_cast<float>(std::pow(t, h.beta2_decay)),  // 1 - beta2_t
               factored ? s.batch * s.rows : n,
               factored ? s.cols : 1};
  Factors f;
  f.eps_sq = eps1 * eps1;
  f.inv_eps = 1.0f / std::sqrt(f.eps_sq);
  const double param_sq = SumSquaresPass(p, eps1, f);
  const double update_sq = UpdateSquaresPass(p, f);
  const double rho = std::min(h.lr, 1.0 / std::sqrt(t));
  const double alpha = std::max(h.eps2, std::sqrt(param_sq) / std::sqrt(static_cast<double>(n))) * rho;
  const double denom = std::max(1.0, std::sqrt(update_sq) / (std::sqrt(static_cast<double>(n)) * h.d));
  ApplyPass(p, f, static_cast<float>(1.0 - h.lr * h.weight_decay), h.weight_decay != 0,
            static_cast<float>(-alpha / denom));
}

}  // namespace rp::workers
