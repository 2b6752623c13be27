// The AVX2 pieces of the sketch and the fingerprint (signature.h) that two
// kernels share: signature_avx2.cpp, which reads the values itself, and the
// statistics' float32 kernel (stats_avx2.cpp), which hands over the values it
// has already loaded and widened, so that one pass over a block gives its
// statistics, fingerprint and sketch. Only for files compiled with -mavx2.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "signature.h"

namespace opdump::sig::avx2 {

// Lane l of vector q of a group of 16 holds element 4q + l; its sign is bit
// 4q + l of a_g. The masks of each nibble (the sign bit set in the lanes to
// flip) come from a table of 16.
struct NibbleMasks {
  alignas(32) uint64_t m[16][4];
  constexpr NibbleMasks() : m{} {
    for (int v = 0; v < 16; ++v)
      for (int l = 0; l < 4; ++l) m[v][l] = (v >> l) & 1 ? 0x8000000000000000ull : 0;
  }
};
inline constexpr NibbleMasks kMasks{};

inline __m256d sign_mask(uint32_t bits, int q) {
  return _mm256_load_pd(reinterpret_cast<const double*>(kMasks.m[(bits >> (4 * q)) & 15]));
}

// One group of 16 values as four vectors (lanes 4q..4q+3 in v[q]), signed by
// the bits of a_g and added to `row`, row c_g of a sketch state.
inline void add_group16(const __m256d (&v)[4], uint32_t a, double* row) {
  for (int q = 0; q < 4; ++q)
    _mm256_storeu_pd(row + 4 * q,
                     _mm256_add_pd(_mm256_loadu_pd(row + 4 * q), _mm256_xor_pd(v[q], sign_mask(a, q))));
}

// fmix32 eight lanes wide.
inline __m256i fmix32x8(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85ebca6bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// The hashes a_g and c_g (K = 16) of the eight groups from that of element e
// (a multiple of 16) on.
inline void hashes16x8(uint64_t e, uint32_t (&a)[8], uint32_t (&c)[8]) {
  const __m256i g = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(e >> 4))),
                                     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i x = _mm256_mullo_epi32(g, _mm256_set1_epi32(static_cast<int>(kGolden)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a),
                      fmix32x8(_mm256_add_epi32(x, _mm256_set1_epi32(static_cast<int>(kSignSeed)))));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c),
                      _mm256_and_si256(fmix32x8(_mm256_add_epi32(x, _mm256_set1_epi32(static_cast<int>(kProjSeed)))),
                                       _mm256_set1_epi32(15)));
}

// The fingerprint and the sketch (K = 16) of consecutive groups of 16 finite
// float32 values, handed over as loaded: the two vectors of raw values (the
// words: a finite float32 is its own canonical word) and the same values
// widened to float64, four per vector. The first group starts at element
// `first`, a multiple of 16. The sums go to the object and to `rows`, the
// caller's zeroed 16 x 16 sketch state (apart from the object, so that the
// compiler keeps the object's sums in registers across the stores to it);
// add_to() adds them to a signature and a sketch state, so a caller that
// finds a NaN or an infinity afterwards drops both and measures the values
// another way.
class Floats16 {
 public:
  Floats16(uint64_t first, double* rows)
      : next_(first), hashed_(first), block_(_mm256_set1_epi32(static_cast<int>(block_key(first)))), rows_(rows) {
    hashes16x8(first, a_, c_);
  }

  void add(__m256 lo, __m256 hi, const __m256d (&v)[4]) {
    const uint64_t e = next_;
    next_ += 16;
    // Fingerprint: words e .. e + 15 are lanes e mod 64 .. + 15 of their
    // block of 64; a 32 x 32 -> 64-bit product per word, even lanes, then odd.
    const int lane = static_cast<int>(e % kBlockWords);
    if (lane == 0) block_ = _mm256_set1_epi32(static_cast<int>(block_key(e)));
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i k0 = _mm256_or_si256(
        _mm256_xor_si256(block_, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLaneKeys.k + lane))), one);
    const __m256i k1 = _mm256_or_si256(
        _mm256_xor_si256(block_, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLaneKeys.k + lane + 8))), one);
    words(_mm256_castps_si256(lo), k0);
    words(_mm256_castps_si256(hi), k1);
    // Sketch: the group's signs from a_g, its row from c_g, hashed eight
    // groups at a time.
    if (e - hashed_ == 8 * 16) {
      hashed_ = e;
      hashes16x8(e, a_, c_);
    }
    const int g = static_cast<int>((e - hashed_) / 16);
    add_group16(v, a_[g], rows_ + c_[g] * 16);
  }

  void add_to(Signature& sig, SketchState& st) const {
    alignas(32) uint64_t f[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(f), f_);
    sig.f += f[0] + f[1] + f[2] + f[3];
    for (int i = 0; i < 16 * 16; i += 4)
      _mm256_storeu_pd(st.acc + i, _mm256_add_pd(_mm256_loadu_pd(st.acc + i), _mm256_loadu_pd(rows_ + i)));
  }

 private:
  void words(__m256i w, __m256i k) {
    f_ = _mm256_add_epi64(f_, _mm256_mul_epu32(w, k));
    f_ = _mm256_add_epi64(f_, _mm256_mul_epu32(_mm256_srli_epi64(w, 32), _mm256_srli_epi64(k, 32)));
  }

  uint64_t next_;    // the element of the next group
  uint64_t hashed_;  // the element of the first of the eight groups a_ and c_ hold
  uint32_t a_[8], c_[8];
  __m256i block_;    // the key of the block of 64 words of the next group
  __m256i f_ = _mm256_setzero_si256();
  double* rows_;  // the sketch's state, rows c_g
};

}  // namespace opdump::sig::avx2
