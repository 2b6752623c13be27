// The fingerprint and sketch kernels for the baseline ISA, and the choice of
// the AVX2 ones where the CPU has them (signature.h).

#include "opdump/cpp/signature/signature.h"

#include <algorithm>

namespace opdump::sig {

namespace portable {
#include "opdump/cpp/signature/signature_kernels.inc"
}  // namespace portable

void add_fingerprint(const void* bytes, int64_t n, uint64_t first, Words words, Signature& sig) {
#if STATS_HAVE_AVX2
  if (avx2::usable()) return avx2::add_fingerprint(bytes, n, first, words, sig);
#endif
  portable::add_fingerprint(bytes, n, first, words, sig);
}

void add_sketch(const double* x, int64_t n, uint64_t first, SketchState& st) {
#if STATS_HAVE_AVX2
  if (avx2::usable()) return avx2::add_sketch(x, n, first, st);
#endif
  portable::add_sketch(x, n, first, st);
}

bool add_sketch_f32(const float* x, int64_t n, uint64_t first, SketchState& st) {
#if STATS_HAVE_AVX2
  if (avx2::usable()) return avx2::add_sketch_f32(x, n, first, st);
#endif
  (void)x, (void)n, (void)first, (void)st;
  return false;
}

void sketch_finish(const SketchState& st, Signature& sig) {
  const int k = st.k;
  double y[kMaxSketch] = {};
  for (int c = 0; c < k; ++c)
    for (int b = 0; b < k; ++b) y[b] += st.acc[c * k + (b ^ c)];
  // y <- H y: the fast Walsh-Hadamard transform, H[b][j] = (-1)^popcount(b & j).
  for (int h = 1; h < k; h *= 2)
    for (int i = 0; i < k; i += 2 * h)
      for (int b = i; b < i + h; ++b) {
        const double u = y[b], v = y[b + h];
        y[b] = u + v;
        y[b + h] = u - v;
      }
  for (int j = 0; j < k; ++j) sig.sketch[j] += y[j];
}

}  // namespace opdump::sig
