// The fingerprint and the sketch of a tensor's values (README: "Fingerprint
// and sketch"), as plain C++ with no torch: the kernels that add a run of
// values to them, and the constants of their definition, which the device
// path (device_stats.cpp) computes with ATen ops and must share.
//
// Both are sums over the elements, in logical order, of terms that depend
// only on an element's index and value: pieces, threads and devices may add
// them up in any order. The fingerprint's sum is exact (modulo 2^64); the
// sketch's are float64.
#pragma once

#include <cstdint>

namespace opdump::sig {

// The definition's constants.
constexpr uint32_t kBlockSeed = 0x243F6A88u;  // the fingerprint's key of a block of 64 words
constexpr uint32_t kLaneSeed = 0x85A308D3u;  // and of a word's place in its block
constexpr uint32_t kGolden = 0x9E3779B1u;  // spreads consecutive indexes
constexpr uint32_t kSignSeed = 0x13198A2Eu;  // a_g: the per-element signs
constexpr uint32_t kProjSeed = 0x03707344u;  // b_g: the per-projection signs
constexpr int kMaxSketch = 32;
constexpr int kBlockWords = 64;  // words per block of the fingerprint's keys

// MurmurHash3's 32-bit finaliser.
constexpr uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// The key of word w is (B[w / 64] XOR L[w mod 64]) OR 1: a hash per block of
// 64 words, computed once per block, and the 64 lane hashes, computed once.
constexpr uint32_t block_key(uint64_t w) {
  return fmix32(static_cast<uint32_t>(w >> 6) * kGolden + kBlockSeed);
}
struct LaneKeys {
  uint32_t k[kBlockWords];
  constexpr LaneKeys() : k{} {
    for (int j = 0; j < kBlockWords; ++j) k[j] = fmix32(static_cast<uint32_t>(j) * kGolden + kLaneSeed);
  }
};
inline constexpr LaneKeys kLaneKeys{};

struct Signature {
  uint64_t f = 0;  // the fingerprint: the sum of word times key, modulo 2^64
  int k = 0;       // sketch length; 0: no sketch
  double sketch[kMaxSketch] = {};

  uint64_t fingerprint() const { return f; }
  void merge(const Signature& o) {
    f += o.f;
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
  double acc[kMaxSketch * kMaxSketch];  // K x K used; zeroed by the constructor
  explicit SketchState(int k_) : k(k_) {
    for (int i = 0; i < k * k; ++i) acc[i] = 0.0;
  }
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
