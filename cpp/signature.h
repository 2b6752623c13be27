// The fingerprint and the sketch of a tensor's values (README: "Fingerprint
// and sketch"), as plain C++ with no torch: the kernels that add a run of
// values to them, and the constants of their definition, which the device
// path (device_stats.cpp) computes with ATen ops and must share.
//
// Both are sums over the elements, in logical order, of terms that depend
// only on an element's index and value: pieces, threads and devices may add
// them up in any order. The fingerprint's sums are exact (modulo 2^32); the
// sketch's are float64.
#pragma once

#include <cstdint>

namespace opdump::sig {

// The definition's constants.
constexpr uint32_t kSeed1 = 0x243F6A88u;  // the fingerprint's high word
constexpr uint32_t kSeed2 = 0x85A308D3u;  // and its low word
constexpr uint32_t kGolden = 0x9E3779B1u;  // spreads consecutive indexes
constexpr uint32_t kSignSeed = 0x13198A2Eu;  // a_g: the per-element signs
constexpr uint32_t kProjSeed = 0x03707344u;  // b_g: the per-projection signs
constexpr int kMaxSketch = 32;

// MurmurHash3's 32-bit finaliser.
inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

struct Signature {
  uint32_t f1 = 0, f2 = 0;  // the fingerprint's two sums
  int k = 0;                // sketch length; 0: no sketch
  double sketch[kMaxSketch] = {};

  uint64_t fingerprint() const { return (static_cast<uint64_t>(f1) << 32) | f2; }
  void merge(const Signature& o) {
    f1 += o.f1;
    f2 += o.f2;
    for (int j = 0; j < k; ++j) sketch[j] += o.sketch[j];
  }
};

// The sketch of a run of values, before the Hadamard transform: with
// c_g = b_g mod K, the projection signs of a group are those of row c_g of
// the Hadamard matrix, permuted by r -> r XOR c_g, so
//   sketch = H y,   y[b] = sum over rows c of acc[c][b XOR c],
//   acc[c][r] = sum of (bit r of a_g ? -x_i : x_i) over the elements
//               i = gK + r of the groups g with c_g = c.
// Adding a value is one signed add into acc (no transform per group);
// sketch_finish folds the rows and transforms once.
struct SketchState {
  int k = 0;
  double acc[kMaxSketch * kMaxSketch] = {};
  explicit SketchState(int k_) : k(k_) {}
};

// Adds the state's values to sig.sketch (sig.k == st.k).
void sketch_finish(const SketchState& st, Signature& sig);

// How a dtype's elements become 32-bit words, and which NaN is canonical.
enum class Words : uint8_t {
  U8,       // 1-byte elements, zero-extended
  U16,      // 2-byte elements, zero-extended
  F16,      // float16, NaN canonicalised
  BF16,     // bfloat16, NaN canonicalised
  U32,      // 4-byte elements
  F32,      // float32 (and the parts of complex64), NaN canonicalised
  U64,      // 8-byte elements: low word, then high
  F64,      // float64 (and the parts of complex128), NaN canonicalised
};

// Adds `n` values of `bytes` (of kind `words`), whose first is value number
// `first` of the tensor (a complex tensor counts its parts), to the
// fingerprint.
void add_fingerprint(const void* bytes, int64_t n, uint64_t first, Words words, Signature& sig);

// Adds `n` finite-or-zeroed float64 values, the first being element `first`
// of the tensor, to the state of a sketch of length st.k (a power of two,
// 2..32).
void add_sketch(const double* x, int64_t n, uint64_t first, SketchState& st);
// The same for float32 values, NaN and infinities counted as 0; false when
// no vector kernel takes them (the caller converts to float64).
bool add_sketch_f32(const float* x, int64_t n, uint64_t first, SketchState& st);

// The vector kernels (signature_avx2.cpp) and whether they may run here.
namespace avx2 {
bool usable();
void add_fingerprint(const void* bytes, int64_t n, uint64_t first, Words words, Signature& sig);
void add_sketch(const double* x, int64_t n, uint64_t first, SketchState& st);
bool add_sketch_f32(const float* x, int64_t n, uint64_t first, SketchState& st);
}  // namespace avx2

}  // namespace opdump::sig
