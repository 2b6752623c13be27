// The statistics of one block of float32 values, with AVX-512 vectors.
// Compiled on its own with -mavx512f -mavx512vl -mavx512dq -mfma (see
// build.rs) and called only where the CPU has them (avx512::usable).
//
// float32 is most of what a training step measures, and the AVX2 kernel
// (stats_avx2.cpp) fills the vector ports: this one does the same in fewer
// instructions. Sixteen values a vector; zeros counted from a compare mask
// with a scalar popcount, off the vector ports; and no pivot: the sums of
// the values and of their squares, in float64. A float32 value and its
// square are exact in float64, so each sum rounds only as it adds.
//
// Without a pivot, m2 = Σv² − (Σv)²/m cancels when the mean is large
// against the spread: its error relative to m2 grows as Σv²/m2 = 1 + mean²/
// var. A block where that exceeds 1,024 is left to the AVX2 kernel, whose
// pivot bounds the cancellation; below it, the sums' rounding (2^-47 of Σv²
// over 64 additions a lane) stays below 2^-37 of m2. Blocks with NaN or
// infinities go there too, where they are counted.

#include <cmath>

// GCC 12's AVX-512 headers start some results from an undefined vector
// (_mm512_undefined_ps) that its flow analysis then calls uninitialised.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "stats_acc.h"

namespace opdump::avx512 {

bool usable() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  return ok;
}

bool add_block(const float* p, int64_t m, Acc& acc) {
  if (m <= 0) return true;
  const __m512 zero_ps = _mm512_setzero_ps();
  __m512 mn = _mm512_set1_ps(INFINITY), mx = _mm512_set1_ps(-INFINITY);
  __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  __m512d q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  int64_t zero = 0;
  int64_t i = 0;
  for (; i + 32 <= m; i += 32) {
    const __m512 a = _mm512_loadu_ps(p + i), b = _mm512_loadu_ps(p + i + 16);
    mn = _mm512_min_ps(_mm512_min_ps(a, b), mn);
    mx = _mm512_max_ps(_mm512_max_ps(a, b), mx);
    zero += __builtin_popcount(_mm512_cmp_ps_mask(a, zero_ps, _CMP_EQ_OQ)) +
            __builtin_popcount(_mm512_cmp_ps_mask(b, zero_ps, _CMP_EQ_OQ));
    const __m512d v0 = _mm512_cvtps_pd(_mm512_castps512_ps256(a));
    const __m512d v1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1));
    const __m512d v2 = _mm512_cvtps_pd(_mm512_castps512_ps256(b));
    const __m512d v3 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(b, 1));
    s0 = _mm512_add_pd(s0, v0);
    s1 = _mm512_add_pd(s1, v1);
    s2 = _mm512_add_pd(s2, v2);
    s3 = _mm512_add_pd(s3, v3);
    q0 = _mm512_fmadd_pd(v0, v0, q0);
    q1 = _mm512_fmadd_pd(v1, v1, q1);
    q2 = _mm512_fmadd_pd(v2, v2, q2);
    q3 = _mm512_fmadd_pd(v3, v3, q3);
  }
  double lo = _mm512_reduce_min_ps(mn), hi = _mm512_reduce_max_ps(mx);
  double s = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
  double q = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(q0, q1), _mm512_add_pd(q2, q3)));
  for (; i < m; ++i) {
    const double v = p[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    zero += v == 0.0;
    s += v;
    q += v * v;
  }
  // NaN or an infinity anywhere makes both sums non-finite (float64 sums of
  // finite float32 values cannot overflow).
  if (!std::isfinite(s) || !std::isfinite(q)) return false;
  const double n = static_cast<double>(m);
  const double m2 = q - s * (s / n);
  if (!(m2 * 1024.0 >= q)) return false;  // a negative m2 fails here too
  Acc b;
  b.finite = m;
  b.zero = zero;
  b.min = lo;
  b.max = hi;
  b.sum = s;
  b.mean = s / n;
  b.m2 = m2;
  b.sumsq = q;
  acc.merge(b);
  return true;
}

}  // namespace opdump::avx512
