// The fingerprint and sketch kernels with AVX2 (signature.h). Compiled on its
// own with -mavx2 (build.rs), called only where the CPU has it.
//
// The fingerprint is signature_kernels.inc's loop, which the compiler
// vectorises. The sketch of length 16, the default, is written out: the
// hashes of eight groups at once; a group of 16 values is four float64
// vectors, signed by xors of the sign bit and added to one row of the
// state. Float32 values are signed before they are widened, with the bits
// of a_g shifted into the sign bit lane by lane. (The statistics' float32
// kernel takes both in its own pass where it can: signature_avx2.h.)

#include <immintrin.h>

#include <algorithm>

#include "signature.h"
#include "signature_avx2.h"

namespace opdump::sig::avx2 {

namespace generic {
#include "signature_kernels.inc"
}  // namespace generic

namespace {

// Whole groups of 16 values from x, the first being element `first` (a
// multiple of 16), the hashes taken eight groups at a time; returns how
// many values were taken. `group` adds one group given a_g and c_g.
template <typename Group>
int64_t groups16(int64_t n, uint64_t first, Group group) {
  uint32_t a[8], c[8];
  int64_t i = 0;
  while (i + 16 <= n) {
    hashes16x8(first + static_cast<uint64_t>(i), a, c);
    const int m = static_cast<int>(std::min<int64_t>(8, (n - i) / 16));
    for (int q = 0; q < m; ++q, i += 16) group(i, a[q], c[q]);
  }
  return i;
}

int64_t groups16_f64(const double* x, int64_t n, uint64_t first, SketchState& st) {
  return groups16(n, first, [&](int64_t i, uint32_t a, uint32_t c) {
    const __m256d v[4] = {_mm256_loadu_pd(x + i), _mm256_loadu_pd(x + i + 4), _mm256_loadu_pd(x + i + 8),
                          _mm256_loadu_pd(x + i + 12)};
    add_group16(v, a, st.acc + c * 16);
  });
}

// Eight float32 values with NaN and infinities as 0 (x * 0 is 0 exactly for
// the finite ones), each lane's sign flipped where its bit of a_g is set:
// `a` shifted left by `shift` puts that bit in the sign bit. Negating in
// float32 before widening gives the float64 values the generic loop does.
inline __m256 finite_signed_ps(__m256 x, __m256i a, __m256i shift) {
  const __m256 zero = _mm256_setzero_ps();
  x = _mm256_and_ps(x, _mm256_cmp_ps(_mm256_mul_ps(x, zero), zero, _CMP_EQ_OQ));
  const __m256i sign = _mm256_and_si256(_mm256_sllv_epi32(a, shift), _mm256_set1_epi32(INT32_MIN));
  return _mm256_xor_ps(x, _mm256_castsi256_ps(sign));
}

int64_t groups16_f32(const float* x, int64_t n, uint64_t first, SketchState& st) {
  // Element r of the group is lane r of lo (r < 8) or lane r - 8 of hi: bit
  // r of a_g goes to bit 31.
  const __m256i shift_lo = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
  const __m256i shift_hi = _mm256_setr_epi32(23, 22, 21, 20, 19, 18, 17, 16);
  return groups16(n, first, [&](int64_t i, uint32_t a, uint32_t c) {
    const __m256i av = _mm256_set1_epi32(static_cast<int>(a));
    const __m256 lo = finite_signed_ps(_mm256_loadu_ps(x + i), av, shift_lo);
    const __m256 hi = finite_signed_ps(_mm256_loadu_ps(x + i + 8), av, shift_hi);
    double* row = st.acc + c * 16;
    const __m256d v[4] = {_mm256_cvtps_pd(_mm256_castps256_ps128(lo)), _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)),
                          _mm256_cvtps_pd(_mm256_castps256_ps128(hi)), _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1))};
    for (int q = 0; q < 4; ++q) _mm256_storeu_pd(row + 4 * q, _mm256_add_pd(_mm256_loadu_pd(row + 4 * q), v[q]));
  });
}

// The part before the first whole group and after the last go through the
// generic loop.
template <typename T, typename Groups>
void sketch16(const T* x, int64_t n, uint64_t first, SketchState& st, Groups groups) {
  auto rest = [&](const T* p, int64_t m, uint64_t at) {
    double buf[16];
    for (int64_t j = 0; j < m; ++j) {
      const double v = static_cast<double>(p[j]);
      buf[j] = v - v == 0.0 ? v : 0.0;
    }
    generic::add_sketch(buf, m, at, st);
  };
  const int64_t head = std::min<int64_t>(n, static_cast<int64_t>((16 - (first & 15)) & 15));
  if (head > 0) rest(x, head, first);
  const int64_t done = head + groups(x + head, n - head, first + static_cast<uint64_t>(head), st);
  if (done < n) rest(x + done, n - done, first + static_cast<uint64_t>(done));
}

}  // namespace

bool usable() {
  static const bool ok = __builtin_cpu_supports("avx2");
  return ok;
}

void add_fingerprint(const void* bytes, int64_t n, uint64_t first, Words words, Signature& sig) {
  generic::add_fingerprint(bytes, n, first, words, sig);
}

void add_sketch(const double* x, int64_t n, uint64_t first, SketchState& st) {
  if (st.k == 16) return sketch16(x, n, first, st, groups16_f64);
  generic::add_sketch(x, n, first, st);
}

bool add_sketch_f32(const float* x, int64_t n, uint64_t first, SketchState& st) {
  if (st.k != 16) return false;
  sketch16(x, n, first, st, groups16_f32);
  return true;
}

}  // namespace opdump::sig::avx2
