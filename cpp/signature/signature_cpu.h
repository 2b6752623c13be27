// The fingerprint and sketch of a CPU tensor's values in logical order, run
// by run (README: "Fingerprint and sketch"): the kernels of signature.h for
// each dtype. The statistics' pass (stats.cpp) adds each L1 block of a
// contiguous tensor while it is in cache; signature_cpu.cpp measures the
// tensors it cannot (a copy in logical order).
#pragma once

#include <cmath>
#include <complex>
#include <type_traits>

#include <ATen/ATen.h>

#include "opdump/cpp/signature/signature.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

struct TensorRow;

// A signature into a row's fingerprint and sketch (signature_cpu.cpp).
void signature_to_row(const sig::Signature& s, TensorRow& row);

// How a dtype's values become words, and how many values an element is (the
// two parts of a complex number are two values); false for none.
bool signature_words(at::ScalarType t, sig::Words& w, int& per_element);

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

// What one run of a tensor adds: the words of its values to the
// fingerprint, its elements to the sketch's state (none when k is 0).
struct SignatureRun {
  sig::Words words;
  int per_element;
  sig::Signature sig;
  sig::SketchState st;
  SignatureRun(sig::Words w, int per, int k) : words(w), per_element(per), st(k) { sig.k = k; }

  // Elements [first, first + n) of the tensor whose element 0 is at `p`.
  template <typename T>
  void add(const T* p, int64_t first, int64_t n) {
    sig::add_fingerprint(p + first, n * per_element, static_cast<uint64_t>(first * per_element), words, sig);
    if (sig.k > 0) sketch_run(p + first, n, first, st);
  }
  // The run's signature, its sketch transformed.
  sig::Signature finish() {
    if (sig.k > 0) sig::sketch_finish(st, sig);
    return sig;
  }
};

// The fingerprint and sketch of a contiguous CPU tensor into `row`
// (signature_cpu.cpp), for a sketch of length `k` (0: the fingerprint only).
// Leaves them unset for a tensor it cannot read as it is (not contiguous,
// with a conj or neg bit, an unknown dtype).
void measure_signature_cpu(const at::Tensor& x, int k, TensorRow& row);

}  // namespace opdump
