// The statistics of one block of floating-point values, with AVX2 vectors.
// Compiled on its own with -mavx2 -mfma -mf16c (see build.rs) and called only
// where the CPU has them (avx2::usable).
//
// One pass over a block: extremes and zero counts in the input's own
// precision (exact there), and, in float64, the sum and the sum of squares
// of the deviations from a pivot, the block's first value. The block's sum of
// squared deviations from its mean is then m2 = Σd² − (Σd)²/m. Shifting by a
// value of the block bounds the cancellation: (Σd)²/m ≤ Σd², and the error
// of Σd² is at most m times the error relative to the two-pass m2, since
// m·var ≥ (pivot − mean)² (the pivot is one of the values). With blocks of
// 1,024 values and float64 sums of float32 values, that stays below 1e-10
// relative even for a block whose first value is an outlier, where two passes
// (the second for the deviations) cost a third more time.
//
// Σd doubles as the check for NaN and infinities: it is finite exactly when
// every value is (float64 sums of finite float32 values cannot overflow; a
// float64 block that does is handed to the portable path, which gives the
// same answer).

#include <cmath>
#include <cstring>

#include <immintrin.h>

#include "../signature/signature_avx2.h"
#include "stats_acc.h"

namespace opdump::avx2 {

namespace {

double hsum(__m256d v) {
  __m128d lo = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(lo, _mm_unpackhi_pd(lo, lo)));
}

// The smallest and largest of the lanes of the running extremes, stored to
// `a` and `b` (N lanes of float or double).
template <typename T, int N>
void fold_extremes(const T (&a)[N], const T (&b)[N], double& lo, double& hi) {
  lo = a[0];
  hi = b[0];
  for (int l = 1; l < N; ++l) {
    lo = a[l] < lo ? a[l] : lo;
    hi = b[l] > hi ? b[l] : hi;
  }
}

void extremes(__m256 mn, __m256 mx, double& lo, double& hi) {
  alignas(32) float a[8], b[8];
  _mm256_store_ps(a, mn);
  _mm256_store_ps(b, mx);
  fold_extremes(a, b, lo, hi);
}

void extremes(__m256d mn, __m256d mx, double& lo, double& hi) {
  alignas(32) double a[4], b[4];
  _mm256_store_pd(a, mn);
  _mm256_store_pd(b, mx);
  fold_extremes(a, b, lo, hi);
}

int64_t hsum_epi32(__m256i v) {
  alignas(32) int32_t x[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(x), v);
  int64_t s = 0;
  for (int32_t e : x) s += e;
  return s;
}

int64_t hsum_epi64(__m256i v) {
  alignas(32) int64_t x[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(x), v);
  return x[0] + x[1] + x[2] + x[3];
}

// Adds the finished block to `acc`: `sd` and `sq` are the sum and the sum
// of squares of the deviations from `pivot`, both already checked finite.
void finish(int64_t m, int64_t zero, double mn, double mx, double pivot, double sd, double sq, Acc& acc) {
  const double n = static_cast<double>(m);
  Acc b;
  b.finite = m;
  b.zero = zero;
  b.min = mn;
  b.max = mx;
  b.sum = sd + pivot * n;
  b.mean = b.sum / n;
  const double m2 = sq - sd * (sd / n);
  b.m2 = m2 > 0 ? m2 : 0;  // rounding must not make a constant block's negative
  b.sumsq = b.m2 + b.sum * b.mean;  // = sum of squares, without cancellation
  acc.merge(b);
}

// Blocks of 8 float32 lanes, read through `load` (8 values at offset i) and
// `scalar` (one value), so float32, bfloat16 and float16 share the code.
// `each` sees every run of 16 values the vector loop takes, as loaded and
// widened (add_block_signed gives them to the signature).
struct NoSignature {
  void operator()(__m256, __m256, const __m256d (&)[4]) const {}
};

template <typename Load, typename Scalar, typename Each = NoSignature>
bool block8(int64_t m, Load load, Scalar scalar, Acc& acc, Each each = {}) {
  if (m <= 0) return true;
  const double pivot = scalar(0);
  const __m256 zero_ps = _mm256_setzero_ps();
  const __m256d pv = _mm256_set1_pd(pivot);
  __m256 mn = _mm256_set1_ps(INFINITY), mx = _mm256_set1_ps(-INFINITY);
  __m256i z = _mm256_setzero_si256();
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  __m256d q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    const __m256 a = load(i), b = load(i + 8);
    mn = _mm256_min_ps(_mm256_min_ps(a, b), mn);
    mx = _mm256_max_ps(_mm256_max_ps(a, b), mx);
    // A true comparison is all ones (-1): subtracting it counts one.
    z = _mm256_sub_epi32(z, _mm256_castps_si256(_mm256_cmp_ps(a, zero_ps, _CMP_EQ_OQ)));
    z = _mm256_sub_epi32(z, _mm256_castps_si256(_mm256_cmp_ps(b, zero_ps, _CMP_EQ_OQ)));
    const __m256d v[4] = {_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)),
                          _mm256_cvtps_pd(_mm256_castps256_ps128(b)), _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1))};
    each(a, b, v);
    const __m256d d0 = _mm256_sub_pd(v[0], pv);
    const __m256d d1 = _mm256_sub_pd(v[1], pv);
    const __m256d d2 = _mm256_sub_pd(v[2], pv);
    const __m256d d3 = _mm256_sub_pd(v[3], pv);
    s0 = _mm256_add_pd(s0, d0);
    s1 = _mm256_add_pd(s1, d1);
    s2 = _mm256_add_pd(s2, d2);
    s3 = _mm256_add_pd(s3, d3);
    q0 = _mm256_fmadd_pd(d0, d0, q0);
    q1 = _mm256_fmadd_pd(d1, d1, q1);
    q2 = _mm256_fmadd_pd(d2, d2, q2);
    q3 = _mm256_fmadd_pd(d3, d3, q3);
  }
  double dmn, dmx;
  extremes(mn, mx, dmn, dmx);
  int64_t zero = hsum_epi32(z);
  double sd = hsum(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
  double sq = hsum(_mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
  for (int64_t k = i; k < m; ++k) {
    const double v = scalar(k);
    dmn = v < dmn ? v : dmn;
    dmx = v > dmx ? v : dmx;
    zero += v == 0.0;
    const double d = v - pivot;
    sd += d;
    sq += d * d;
  }
  if (!std::isfinite(sd) || !std::isfinite(sq)) return false;
  finish(m, zero, dmn, dmx, pivot, sd, sq, acc);
  return true;
}

// block8's statistics for a block that holds NaN or infinities (a masked
// attention score, a padded row): counted here, in the same vectors, rather
// than converted value by value on the portable path. Every value is read
// once more, as the finite ones are by block8. The pivot is the block's
// first finite value; each NaN or infinity takes its place in the sums
// (a deviation of zero) and is left out of the extremes.
template <typename Load, typename Scalar>
void block8_masked(int64_t m, Load load, Scalar scalar, Acc& acc) {
  int64_t first = 0;
  while (first < m && !std::isfinite(scalar(first))) ++first;
  int64_t nan = 0, posinf = 0, neginf = 0;
  for (int64_t k = 0; k < first; ++k) {
    const float v = scalar(k);
    nan += std::isnan(v);
    posinf += v > 0;
    neginf += v < 0;
  }
  if (first < m) {
    const float pivot = scalar(first);
    const __m256 zero_ps = _mm256_setzero_ps(), inf = _mm256_set1_ps(INFINITY), minus_inf = _mm256_set1_ps(-INFINITY);
    const __m256 pf = _mm256_set1_ps(pivot);
    const __m256d pv = _mm256_set1_pd(pivot);
    __m256 mn = inf, mx = minus_inf;
    __m256i z = _mm256_setzero_si256(), cn = z, cp = z, cm = z;
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    int64_t i = first;
    for (; i + 8 <= m; i += 8) {
      const __m256 a = load(i);
      // x - x is 0 for a finite x, NaN for NaN and the infinities.
      const __m256 finite = _mm256_cmp_ps(_mm256_sub_ps(a, a), zero_ps, _CMP_EQ_OQ);
      cn = _mm256_sub_epi32(cn, _mm256_castps_si256(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)));
      cp = _mm256_sub_epi32(cp, _mm256_castps_si256(_mm256_cmp_ps(a, inf, _CMP_EQ_OQ)));
      cm = _mm256_sub_epi32(cm, _mm256_castps_si256(_mm256_cmp_ps(a, minus_inf, _CMP_EQ_OQ)));
      z = _mm256_sub_epi32(z, _mm256_castps_si256(_mm256_cmp_ps(a, zero_ps, _CMP_EQ_OQ)));
      mn = _mm256_min_ps(_mm256_blendv_ps(inf, a, finite), mn);
      mx = _mm256_max_ps(_mm256_blendv_ps(minus_inf, a, finite), mx);
      const __m256 f = _mm256_blendv_ps(pf, a, finite);
      const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(f)), pv);
      const __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)), pv);
      s0 = _mm256_add_pd(s0, d0);
      s1 = _mm256_add_pd(s1, d1);
      q0 = _mm256_fmadd_pd(d0, d0, q0);
      q1 = _mm256_fmadd_pd(d1, d1, q1);
    }
    double dmn, dmx;
    extremes(mn, mx, dmn, dmx);
    int64_t zero = hsum_epi32(z);
    nan += hsum_epi32(cn);
    posinf += hsum_epi32(cp);
    neginf += hsum_epi32(cm);
    double sd = hsum(_mm256_add_pd(s0, s1));
    double sq = hsum(_mm256_add_pd(q0, q1));
    for (int64_t k = i; k < m; ++k) {
      const float v = scalar(k);
      if (!std::isfinite(v)) {
        nan += std::isnan(v);
        posinf += v == INFINITY;
        neginf += v == -INFINITY;
        continue;
      }
      dmn = v < dmn ? v : dmn;
      dmx = v > dmx ? v : dmx;
      zero += v == 0.0f;
      const double d = static_cast<double>(v) - pivot;
      sd += d;
      sq += d * d;
    }
    finish(m - nan - posinf - neginf, zero, dmn, dmx, pivot, sd, sq, acc);
  }
  acc.nan += nan;
  acc.posinf += posinf;
  acc.neginf += neginf;
}

// Any block: block8's one pass, and block8_masked's when that pass finds a
// NaN or an infinity.
template <typename Load, typename Scalar>
bool block8_counted(int64_t m, Load load, Scalar scalar, Acc& acc) {
  if (!block8(m, load, scalar, acc)) block8_masked(m, load, scalar, acc);
  return true;
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

bool usable() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
}

bool add_block(const float* p, int64_t m, Acc& acc) {
  const auto load = [p](int64_t i) { return _mm256_loadu_ps(p + i); };
  const auto scalar = [p](int64_t i) { return p[i]; };
  return block8_counted(m, load, scalar, acc);
}

bool add_block_signed(const float* p, int64_t m, uint64_t first, Acc& acc, sig::Signature& sig,
                      sig::SketchState& st) {
  alignas(32) double rows[16 * 16] = {};
  sig::avx2::Floats16 signature(first, rows);
  const bool finite = block8(
      m, [p](int64_t i) { return _mm256_loadu_ps(p + i); }, [p](int64_t i) { return p[i]; }, acc,
      [&](__m256 a, __m256 b, const __m256d (&v)[4]) { signature.add(a, b, v); });
  if (finite) signature.add_to(sig, st);
  return finite;
}

bool add_block_bf16(const uint16_t* p, int64_t m, Acc& acc) {
  const auto load = [p](int64_t i) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  };
  const auto scalar = [p](int64_t i) { return bf16_to_float(p[i]); };
  return block8_counted(m, load, scalar, acc);
}

bool add_block_f16(const uint16_t* p, int64_t m, Acc& acc) {
  const auto load = [p](int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
  };
  const auto scalar = [p](int64_t i) { return _cvtsh_ss(p[i]); };
  return block8_counted(m, load, scalar, acc);
}

// float64: four lanes per vector, extremes and sums in float64.
bool add_block(const double* p, int64_t m, Acc& acc) {
  if (m <= 0) return true;
  const double pivot = p[0];
  const __m256d zero_pd = _mm256_setzero_pd();
  const __m256d pv = _mm256_set1_pd(pivot);
  __m256d mn = _mm256_set1_pd(INFINITY), mx = _mm256_set1_pd(-INFINITY);
  __m256i z = _mm256_setzero_si256();
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
  int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const __m256d a = _mm256_loadu_pd(p + i), b = _mm256_loadu_pd(p + i + 4);
    mn = _mm256_min_pd(_mm256_min_pd(a, b), mn);
    mx = _mm256_max_pd(_mm256_max_pd(a, b), mx);
    z = _mm256_sub_epi64(z, _mm256_castpd_si256(_mm256_cmp_pd(a, zero_pd, _CMP_EQ_OQ)));
    z = _mm256_sub_epi64(z, _mm256_castpd_si256(_mm256_cmp_pd(b, zero_pd, _CMP_EQ_OQ)));
    const __m256d d0 = _mm256_sub_pd(a, pv), d1 = _mm256_sub_pd(b, pv);
    s0 = _mm256_add_pd(s0, d0);
    s1 = _mm256_add_pd(s1, d1);
    q0 = _mm256_fmadd_pd(d0, d0, q0);
    q1 = _mm256_fmadd_pd(d1, d1, q1);
  }
  double dmn, dmx;
  extremes(mn, mx, dmn, dmx);
  int64_t zero = hsum_epi64(z);
  double sd = hsum(_mm256_add_pd(s0, s1));
  double sq = hsum(_mm256_add_pd(q0, q1));
  for (int64_t k = i; k < m; ++k) {
    const double v = p[k];
    dmn = v < dmn ? v : dmn;
    dmx = v > dmx ? v : dmx;
    zero += v == 0.0;
    const double d = v - pivot;
    sd += d;
    sq += d * d;
  }
  if (!std::isfinite(sd) || !std::isfinite(sq)) return false;
  finish(m, zero, dmn, dmx, pivot, sd, sq, acc);
  return true;
}

}  // namespace opdump::avx2
