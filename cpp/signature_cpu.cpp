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
#include "opdump/cpp/signature_cpu.h"

namespace opdump {

bool signature_words(at::ScalarType t, sig::Words& w, int& per_element) {
  using sig::Words;
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

namespace {

constexpr int64_t kChunk = int64_t{1} << 18;

template <typename T>
sig::Signature signature_of(const T* p, int64_t n, int k, sig::Words words, int per_element) {
  auto run = [&](int64_t first, int64_t len) {
    SignatureRun r(words, per_element, k);
    r.add(p, first, len);
    return r.finish();
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
  sig::Words words;
  int per_element;
  if (!x.is_contiguous() || x.is_conj() || x.is_neg() || !signature_words(x.scalar_type(), words, per_element))
    return;
  sig::Signature s;
  AT_DISPATCH_V2(x.scalar_type(), "opdump_signature", AT_WRAP([&] {
    s = signature_of(static_cast<const scalar_t*>(x.const_data_ptr()), x.numel(), k, words, per_element);
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kBool,
      AT_EXPAND(AT_FLOAT8_TYPES), AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES), at::kComplexHalf);
  signature_to_row(s, row);
}

}  // namespace opdump
