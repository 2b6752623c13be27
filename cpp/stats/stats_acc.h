// Running statistics over the finite values of a tensor, merged block by
// block. Plain C++ (no torch), shared by the portable statistics code and the
// vector kernels.
#pragma once

#include <cstdint>
#include <limits>

#include "../signature/signature.h"

namespace opdump {

struct Acc {
  int64_t finite = 0, nan = 0, posinf = 0, neginf = 0, zero = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  // Sum and sum of squares of the finite values; mean and sum of squared
  // deviations (m2) as Chan et al. merge them, so the variance stays accurate
  // when the mean is large against the spread.
  double sum = 0, sumsq = 0, mean = 0, m2 = 0;

  void merge(const Acc& o) {
    nan += o.nan;
    posinf += o.posinf;
    neginf += o.neginf;
    zero += o.zero;
    min = o.min < min ? o.min : min;
    max = o.max > max ? o.max : max;
    sum += o.sum;
    sumsq += o.sumsq;
    if (o.finite == 0) return;
    if (finite == 0) {
      mean = o.mean;
      m2 = o.m2;
    } else {
      const double n = static_cast<double>(finite + o.finite);
      const double delta = o.mean - mean;
      mean += delta * static_cast<double>(o.finite) / n;
      m2 += o.m2 + delta * delta * static_cast<double>(finite) * static_cast<double>(o.finite) / n;
    }
    finite += o.finite;
  }
};

// Vector kernels (stats_avx2.cpp), for machines with AVX2, FMA and F16C.
// Each adds one block of `m` values to `acc` and returns true. The float32,
// bfloat16 and float16 kernels count NaN and infinities themselves; the
// float64 one, whose sums may overflow, adds nothing to a block that holds
// any and returns false, and the caller takes the portable path for it.
namespace avx2 {
bool usable();
bool add_block(const float* p, int64_t m, Acc& acc);
bool add_block(const double* p, int64_t m, Acc& acc);
bool add_block_bf16(const uint16_t* p, int64_t m, Acc& acc);
// add_block's statistics of float32 values and, in the same pass, the
// fingerprint and the sketch (K = 16) of the first m - m % 16 of them: the
// first value is element `first` (a multiple of 16) of the tensor, and the
// caller adds the last m % 16. On false (a NaN or an infinity) nothing has
// been added to any of the three.
bool add_block_signed(const float* p, int64_t m, uint64_t first, Acc& acc, sig::Signature& sig,
                      sig::SketchState& st);
bool add_block_f16(const uint16_t* p, int64_t m, Acc& acc);
}  // namespace avx2

// The float32 kernel with AVX-512 (stats_avx512.cpp), for machines with
// AVX512F, VL and DQ: adds one block to `acc` and returns true, or adds
// nothing and returns false for a block that holds NaN or infinities, or
// whose mean is so large against its spread that the AVX2 kernel's pivot is
// needed.
namespace avx512 {
bool usable();
bool add_block(const float* p, int64_t m, Acc& acc);
}  // namespace avx512

}  // namespace opdump
