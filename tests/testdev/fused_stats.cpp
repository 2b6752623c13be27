// testdev's kernel for opdump::fused_stats (fused_stats.h): the statistics
// row of a tensor in one pass over its memory, as a backend with a fused
// reduction computes it, instead of the dozen ATen reductions opdump falls
// back to. It reads the tensor through its host alias, in memory order
// (every statistic is order-independent), and writes the row into a testdev
// tensor of 8 float64 values: [finite count, NaN count, +inf count, zero
// count, min, max, mean, m2], the last four over the finite values (m2: the
// sum of their squared deviations from their mean). Complex values count by
// magnitude. It needs no device memory but the row.

#include "fused_stats.h"

// The loops below are the device's arithmetic: let the compiler vectorize them.
#pragma GCC optimize("O3")

#include "counters.h"
#include "device.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/TensorIterator.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>

namespace testdev {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

template <typename T>
inline double to_double(T v) {
  if constexpr (c10::is_complex<T>::value) {
    return std::abs(std::complex<double>(static_cast<double>(v.real()), static_cast<double>(v.imag())));
  } else {
    return static_cast<double>(v);
  }
}

struct Acc {
  int64_t finite = 0, nan = 0, posinf = 0, zero = 0;
  double min = kInf, max = -kInf, mean = 0, m2 = 0;

  // A block of values: every one finite when their sum is (float64 sums of
  // a block of at most kBlock values cannot overflow unless one is huge, and
  // then the careful path below still gives the right answer).
  // Built for AVX2 too, chosen at run time where the CPU has it.
  __attribute__((target_clones("avx2", "default"))) void add_block(const double* v, int64_t n) {
    // Eight lanes each, so that the sums do not wait on one another.
    double sum[8] = {}, lo[8], hi[8], zeros[8] = {};
    std::fill(lo, lo + 8, kInf);
    std::fill(hi, hi + 8, -kInf);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int k = 0; k < 8; ++k) {
        const double x = v[i + k];
        sum[k] += x;
        lo[k] = x < lo[k] ? x : lo[k];
        hi[k] = x > hi[k] ? x : hi[k];
        zeros[k] += x == 0.0 ? 1.0 : 0.0;
      }
    }
    for (; i < n; ++i) {
      sum[0] += v[i];
      lo[0] = v[i] < lo[0] ? v[i] : lo[0];
      hi[0] = v[i] > hi[0] ? v[i] : hi[0];
      zeros[0] += v[i] == 0.0 ? 1.0 : 0.0;
    }
    double s = 0, l = kInf, h = -kInf, z = 0;
    for (int k = 0; k < 8; ++k) {
      s += sum[k];
      l = std::min(l, lo[k]);
      h = std::max(h, hi[k]);
      z += zeros[k];
    }
    if (!std::isfinite(s)) return add_careful(v, n);
    const double m = s / static_cast<double>(n);
    double q[8] = {};
    for (i = 0; i + 8 <= n; i += 8) {
      for (int k = 0; k < 8; ++k) q[k] += (v[i + k] - m) * (v[i + k] - m);
    }
    for (; i < n; ++i) q[0] += (v[i] - m) * (v[i] - m);
    double qs = 0;
    for (double e : q) qs += e;
    merge(n, m, qs, l, h);
    zero += static_cast<int64_t>(z);
  }

  void add_careful(const double* v, int64_t n) {
    double buf[kBlock];
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = v[i];
      if (d != d) {
        ++nan;
      } else if (d == kInf) {
        ++posinf;
      } else if (d == -kInf) {
        // counted by the caller as the rest
      } else {
        buf[k++] = d;
      }
    }
    if (k == 0) return;
    double sum = 0, lo = kInf, hi = -kInf;
    for (int64_t i = 0; i < k; ++i) {
      sum += buf[i];
      lo = std::min(lo, buf[i]);
      hi = std::max(hi, buf[i]);
      zero += buf[i] == 0.0;
    }
    const double m = sum / static_cast<double>(k);
    double q = 0;
    for (int64_t i = 0; i < k; ++i) q += (buf[i] - m) * (buf[i] - m);
    merge(k, m, q, lo, hi);
  }

  // Chan's formula: this and a block of `n` values with mean `m` and sum of
  // squared deviations `q`.
  void merge(int64_t n, double m, double q, double lo, double hi) {
    const double na = static_cast<double>(finite), nb = static_cast<double>(n);
    const double delta = m - mean;
    const double total = na + nb;
    mean += delta * nb / total;
    m2 += q + delta * delta * na * nb / total;
    finite += n;
    min = std::min(min, lo);
    max = std::max(max, hi);
  }

  static constexpr int64_t kBlock = 256;
};

at::Tensor fused_stats(const at::Tensor& t) {
  Launch launch;
  const at::Tensor h = host_alias(t);
  Acc acc;
  if (h.numel() > 0) {
    auto iter = at::TensorIteratorConfig().add_const_input(h).enforce_linear_iteration().build();
    AT_DISPATCH_V2(h.scalar_type(), "testdev_fused_stats", AT_WRAP([&] {
      double block[Acc::kBlock];
      int64_t filled = 0;
      iter.serial_for_each(
          [&](char** data, const int64_t* strides, int64_t size0, int64_t size1) {
            for (int64_t j = 0; j < size1; ++j) {
              const char* p = data[0] + j * strides[1];
              for (int64_t left = size0; left > 0;) {
                const int64_t take = std::min(left, Acc::kBlock - filled);
                if (strides[0] == sizeof(scalar_t)) {
                  const auto* x = reinterpret_cast<const scalar_t*>(p);
                  for (int64_t i = 0; i < take; ++i) block[filled + i] = to_double(x[i]);
                } else {
                  for (int64_t i = 0; i < take; ++i)
                    block[filled + i] = to_double(*reinterpret_cast<const scalar_t*>(p + i * strides[0]));
                }
                filled += take;
                left -= take;
                p += take * strides[0];
                if (filled == Acc::kBlock) {
                  acc.add_block(block, filled);
                  filled = 0;
                }
              }
            }
          },
          {0, h.numel()});
      if (filled > 0) acc.add_block(block, filled);
    }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kBool,
        AT_EXPAND(AT_FLOAT8_TYPES), AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES), at::kComplexHalf);
  }
  at::Tensor row = at::empty({8}, t.options().dtype(at::kDouble));
  double* v = host_alias(row).mutable_data_ptr<double>();
  const double values[8] = {static_cast<double>(acc.finite), static_cast<double>(acc.nan),
                            static_cast<double>(acc.posinf), static_cast<double>(acc.zero),
                            acc.min, acc.max, acc.mean, acc.m2};
  std::copy(values, values + 8, v);
  return row;
}

}  // namespace

bool fused_stats_enabled() {
  static const bool on = env_switch("TESTDEV_FUSED_STATS", true);
  return on;
}

void register_fused_stats(torch::Library& opdump_impl) {
  if (fused_stats_enabled()) opdump_impl.impl("fused_stats", TORCH_FN(fused_stats));
}

}  // namespace testdev
