// The fingerprint and sketch kernels with AVX2 (signature.h). Compiled on its
// own with -mavx2 (build.rs), called only where the CPU has it.
//
// The fingerprint is signature_kernels.inc's loop, which the compiler
// vectorises eight words wide. The sketch of length 16, the default, is
// written out: a group of 16 values is four float64 vectors, signed by xors
// of the sign bit (one table lookup per nibble of a_g) and added to one row
// of the state.

#include <immintrin.h>

#include <algorithm>

#include "signature.h"

namespace opdump::sig::avx2 {

namespace generic {
#include "signature_kernels.inc"
}  // namespace generic

namespace {

// Lane l of vector q of a group holds element 4q + l; its sign is bit 4q + l
// of `bits`. The masks of each nibble (the sign bit set in the lanes to
// flip) come from a table of 16.
struct NibbleMasks {
  alignas(32) uint64_t m[16][4];
  NibbleMasks() {
    for (int v = 0; v < 16; ++v)
      for (int l = 0; l < 4; ++l) m[v][l] = (v >> l) & 1 ? 0x8000000000000000ull : 0;
  }
};
const NibbleMasks kMasks;

inline __m256d sign_mask(uint32_t bits, int q) {
  return _mm256_load_pd(reinterpret_cast<const double*>(kMasks.m[(bits >> (4 * q)) & 15]));
}

// One group of 16 values as four vectors (lanes 4q..4q+3 in v[q]), signed by
// the bits of a_g and added to row c_g of the state.
inline void add_group16(const __m256d (&v)[4], uint32_t a, uint32_t c, SketchState& st) {
  double* row = st.acc + c * 16;
  for (int q = 0; q < 4; ++q)
    _mm256_storeu_pd(row + 4 * q,
                     _mm256_add_pd(_mm256_loadu_pd(row + 4 * q), _mm256_xor_pd(v[q], sign_mask(a, q))));
}

inline void hashes16(uint64_t e, uint32_t& a, uint32_t& c) {
  const uint32_t g = static_cast<uint32_t>(e >> 4) * kGolden;
  a = fmix32(g + kSignSeed);
  c = fmix32(g + kProjSeed) & 15u;
}

// Whole groups of 16 float64 values from x; returns how many were taken.
int64_t groups16(const double* x, int64_t n, uint64_t first, SketchState& st) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint32_t a, c;
    hashes16(first + static_cast<uint64_t>(i), a, c);
    const __m256d v[4] = {_mm256_loadu_pd(x + i), _mm256_loadu_pd(x + i + 4), _mm256_loadu_pd(x + i + 8),
                          _mm256_loadu_pd(x + i + 12)};
    add_group16(v, a, c, st);
  }
  return i;
}

// Four float32 values as float64, NaN and infinities as 0 (x * 0 is 0
// exactly for the finite ones).
inline __m256d finite_pd(__m128 x) {
  const __m128 finite = _mm_cmp_ps(_mm_mul_ps(x, _mm_setzero_ps()), _mm_setzero_ps(), _CMP_EQ_OQ);
  return _mm256_cvtps_pd(_mm_and_ps(x, finite));
}

int64_t groups16_f32(const float* x, int64_t n, uint64_t first, SketchState& st) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint32_t a, c;
    hashes16(first + static_cast<uint64_t>(i), a, c);
    const __m256d v[4] = {finite_pd(_mm_loadu_ps(x + i)), finite_pd(_mm_loadu_ps(x + i + 4)),
                          finite_pd(_mm_loadu_ps(x + i + 8)), finite_pd(_mm_loadu_ps(x + i + 12))};
    add_group16(v, a, c, st);
  }
  return i;
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
  if (st.k == 16) return sketch16(x, n, first, st, groups16);
  generic::add_sketch(x, n, first, st);
}

bool add_sketch_f32(const float* x, int64_t n, uint64_t first, SketchState& st) {
  if (st.k != 16) return false;
  sketch16(x, n, first, st, groups16_f32);
  return true;
}

}  // namespace opdump::sig::avx2
