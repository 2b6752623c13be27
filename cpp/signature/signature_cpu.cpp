// The fingerprint and sketch of a CPU tensor (README: "Fingerprint and
// sketch"), from its values in logical order: the kernels of signature.h over
// the tensor's memory, which the caller has made contiguous, in chunks
// (chunked.h).

#include <cmath>
#include <complex>

#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>

#include "opdump/cpp/common/chunked.h"
#include "opdump/cpp/signature/signature.h"
#include "opdump/cpp/signature/signature_cpu.h"

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

template <typename T>
sig::Signature signature_of(const T* p, int64_t n, int k, sig::Words words, int per_element) {
  sig::Signature total;
  total.k = k;
  return chunked(n, total, [&](int64_t first, int64_t len) {
    SignatureRun r(words, per_element, k);
    r.add(p, first, len);
    return r.finish();
  });
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
