// The fingerprint and sketch of a CPU tensor (README: "Fingerprint and
// sketch"), from its values in logical order: the kernels of signature.h over
// the tensor's memory, which the caller has made contiguous. Large tensors
// are split into fixed chunks measured in parallel and added up in chunk
// order, so the result does not depend on the thread count.

#include <cmath>
#include <complex>

#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/Parallel.h>

#include "opdump/cpp/internal.h"
#include "opdump/cpp/signature.h"

namespace opdump {

namespace {

using sig::Words;

// How the dtype's values become words, and how many values an element is
// (the two parts of a complex number are two values).
bool words_of(at::ScalarType t, Words& w, int& per_element) {
  per_element = 1;
  switch (t) {
    case at::kFloat: w = Words::F32; return true;
    case at::kDouble: w = Words::F64; return true;
    case at::kHalf: w = Words::F16; return true;
    case at::kBFloat16: w = Words::BF16; return true;
    case at::kComplexFloat: w = Words::F32; per_element = 2; return true;
    case at::kComplexDouble: w = Words::F64; per_element = 2; return true;
    case at::kComplexHalf: w = Words::F16; per_element = 2; return true;
    default: break;
  }
  switch (c10::elementSize(t)) {
    case 1: w = Words::U8; return true;
    case 2: w = Words::U16; return true;
    case 4: w = Words::U32; return true;
    case 8: w = Words::U64; return true;
    default: return false;
  }
}

template <typename T>
inline double sketch_value(T v) {
  double d;
  if constexpr (c10::is_complex<T>::value) {
    d = std::abs(std::complex<double>(static_cast<double>(v.real()), static_cast<double>(v.imag())));
  } else {
    d = static_cast<double>(v);
  }
  return d - d == 0.0 ? d : 0.0;  // NaN and infinities count as 0
}

// Elements [first, first + n) of `p` to the sketch's state.
template <typename T>
void sketch_run(const T* p, int64_t n, int64_t first, sig::SketchState& st) {
  if constexpr (std::is_same_v<T, float>) {
    if (sig::add_sketch_f32(p, n, static_cast<uint64_t>(first), st)) return;
  }
  constexpr int64_t kBlock = 1024;
  double buf[kBlock];
  for (int64_t s = 0; s < n; s += kBlock) {
    const int64_t m = std::min(kBlock, n - s);
    for (int64_t i = 0; i < m; ++i) buf[i] = sketch_value(p[s + i]);
    sig::add_sketch(buf, m, static_cast<uint64_t>(first + s), st);
  }
}

constexpr int64_t kChunk = int64_t{1} << 18;

template <typename T>
sig::Signature signature_of(const T* p, int64_t n, int k, Words words, int per_element) {
  auto run = [&](int64_t first, int64_t len) {
    sig::Signature s;
    s.k = k;
    sig::add_fingerprint(p + first, len * per_element, static_cast<uint64_t>(first * per_element), words, s);
    if (k > 0) {
      sig::SketchState st(k);
      sketch_run(p + first, len, first, st);
      sig::sketch_finish(st, s);
    }
    return s;
  };
  if (n < 4 * kChunk) return run(0, n);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<sig::Signature> parts(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) parts[c] = run(c * kChunk, std::min(kChunk, n - c * kChunk));
  });
  sig::Signature total;
  total.k = k;
  for (const auto& s : parts) total.merge(s);
  return total;
}

}  // namespace

void signature_to_row(const sig::Signature& s, TensorRow& row) {
  row.fingerprint = s.fingerprint();
  row.has_fingerprint = true;
  row.sketch.clear();
  row.sketch.reserve(static_cast<size_t>(s.k));
  for (int j = 0; j < s.k; ++j) row.sketch.push_back(s.sketch[j]);
}

void measure_signature_cpu(const at::Tensor& x, int k, TensorRow& row) {
  Words words;
  int per_element;
  if (!x.is_contiguous() || x.is_conj() || x.is_neg() || !words_of(x.scalar_type(), words, per_element)) return;
  sig::Signature s;
  AT_DISPATCH_V2(x.scalar_type(), "opdump_signature", AT_WRAP([&] {
    s = signature_of(static_cast<const scalar_t*>(x.const_data_ptr()), x.numel(), k, words, per_element);
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kBool,
      AT_EXPAND(AT_FLOAT8_TYPES), AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES), at::kComplexHalf);
  signature_to_row(s, row);
}

}  // namespace opdump
