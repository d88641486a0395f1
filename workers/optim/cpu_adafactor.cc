#include "workers/optim/cpu_adafactor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "workers/base/mutex.h"

namespace rp::workers {
namespace {

constexpr int64_t kMinElementsPerSlice = 1 << 14;

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

}  // namespace

void FusedAdafactor(const AdafactorBuffers& b, const AdafactorShape& s, const AdafactorHyper& h,
                    OptimizerThreads* pool) {
  const int64_t n = s.numel();
  if (n <= 0) return;
  const bool factored = s.rows > 0;
  const double t = static_cast<double>(h.step);
  const float eps1 = h.eps1 > 0 ? static_cast<float>(h.eps1) : std::numeric_limits<float>::epsilon();
  const float beta = static_cast<float>(std::pow(t, h.beta2_decay));  // 1 - beta2_t
  const float gscale = h.maximize ? -h.grad_scale : h.grad_scale;
  // Factored: a unit is one row of `cols` elements; unfactored: one element.
  const int64_t units = factored ? s.batch * s.rows : n;
  const int64_t unit_len = factored ? s.cols : 1;

  // (1) The parameter's sum of squares; the gradient's row means (into row_var) and column sums.
  std::vector<Sums> parts = SlicedInOrder<Sums>(units, unit_len, pool, [&](int64_t u0, int64_t u1) {
    Sums out;
    if (factored) out.col_sq.assign(static_cast<size_t>(s.batch * s.cols), 0.0);
    for (int64_t u = u0; u < u1; ++u) {
      const float* p = b.param + u * unit_len;
      const float* g = b.grad + u * unit_len;
      double psq = 0, rsq = 0;
      if (factored) {
        double* col = out.col_sq.data() + (u / s.rows) * s.cols;
        for (int64_t c = 0; c < unit_len; ++c) {
          const double gv = static_cast<double>(g[c] * gscale);
          psq += static_cast<double>(p[c]) * p[c];
          rsq += gv * gv;
          col[c] += gv * gv;
        }
        const float row_mean = static_cast<float>(rsq / static_cast<double>(s.cols));
        b.row_var[u] = Lerp(b.row_var[u], row_mean, beta);
      } else {
        psq = static_cast<double>(p[0]) * p[0];
        const float gv = g[0] * gscale;
        b.variance[u] = Lerp(b.variance[u], gv * gv, beta);
      }
      out.param_sq += psq;
    }
    return out;
  });
  double param_sq = 0;
  for (const Sums& part : parts) param_sq += part.param_sq;
  std::vector<float> row_mean_of_var;  // factored: per batch, mean over rows of row_var, clamped at eps1
  if (factored) {
    for (int64_t i = 0; i < s.batch * s.cols; ++i) {
      double sq = 0;
      for (const Sums& part : parts) sq += part.col_sq[static_cast<size_t>(i)];
      b.col_var[i] = Lerp(b.col_var[i], static_cast<float>(sq / static_cast<double>(s.rows)), beta);
    }
    for (int64_t k = 0; k < s.batch; ++k) {
      double sum = 0;
      for (int64_t r = 0; r < s.rows; ++r) sum += b.row_var[k * s.rows + r];
      row_mean_of_var.push_back(std::max(static_cast<float>(sum / static_cast<double>(s.rows)), eps1));
    }
  }
  const float eps1_sq = eps1 * eps1;
  // The update's element: g * rsqrt(max(variance estimate, eps1^2)).
  auto update_at = [&](int64_t u, int64_t c, float g) {
    float var;
    if (factored) {
      const int64_t k = u / s.rows;
      var = b.row_var[u] * b.col_var[k * s.cols + c] / row_mean_of_var[static_cast<size_t>(k)];
    } else {
      var = b.variance[u];
    }
    return g / std::sqrt(std::max(var, eps1_sq));
  };

  // (2) The update's sum of squares (its RMS clipping).
  std::vector<double> usq = SlicedInOrder<double>(units, unit_len, pool, [&](int64_t u0, int64_t u1) {
    double sum = 0;
    for (int64_t u = u0; u < u1; ++u) {
      const float* g = b.grad + u * unit_len;
      for (int64_t c = 0; c < unit_len; ++c) {
        const double x = update_at(u, c, g[c] * gscale);
        sum += x * x;
      }
    }
    return sum;
  });
  double update_sq = 0;
  for (double x : usq) update_sq += x;

  const double rho = std::min(h.lr, 1.0 / std::sqrt(t));
  const double alpha = std::max(h.eps2, std::sqrt(param_sq) / std::sqrt(static_cast<double>(n))) * rho;
  const double denom = std::max(1.0, std::sqrt(update_sq) / (std::sqrt(static_cast<double>(n)) * h.d));
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float step = static_cast<float>(-alpha / denom);

  // (3) Decay, step, master.
  SlicedInOrder<int>(units, unit_len, pool, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      float* p = b.param + u * unit_len;
      const float* g = b.grad + u * unit_len;
      for (int64_t c = 0; c < unit_len; ++c) {
        float v = p[c];
        if (h.weight_decay != 0) v = v * decay;
        v = v + step * update_at(u, c, g[c] * gscale);
        p[c] = v;
        StoreMaster(b.master, b.master_dtype, u * unit_len + c, v);
      }
    }
    return 0;
  });
}

}  // namespace rp::workers
