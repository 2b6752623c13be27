// testdev's kernels for opdump::fused_stats and opdump::fused_stats_batch
// (fused_stats.h): the statistics row of a tensor in one pass over its
// memory, as a backend with a fused reduction computes it, instead of the
// dozen ATen reductions opdump falls back to. It reads the tensor through its
// host alias, in logical order (enforce_linear_iteration; the statistics do
// not depend on the order, the fingerprint and sketch of the batch kernel
// do), and writes the row into a testdev tensor of 8 float64 values:
// [finite count, NaN count, +inf count, zero count, min, max, mean, m2], the
// last four over the finite values (m2: the sum of their squared deviations
// from their mean). Complex values count by magnitude. It needs no device
// memory but the row.
//
// The batch kernel gives the rows of several tensors in one launch, each
// followed, when asked for a sketch of length K, by the tensor's fingerprint
// in three limbs and its sketch before the Hadamard transform (README.md,
// "Fused statistics"; opdump's definition is cpp/signature/signature.h, and
// cpp/signature/signature_device.cpp computes the same with ATen ops). Both are added
// in the same pass as the statistics, from the same values.

#include "fused_stats.h"

// The loops below are the device's arithmetic: let the compiler vectorize them.
#pragma GCC optimize("O3")

#include "counters.h"
#include "device.h"
// Header-only here: the constants and hashes of the definition (the sums
// are written below, so opdump's own kernels are not linked in).
#include "../../cpp/signature/signature.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/NumericUtils.h>
#include <ATen/TensorIterator.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

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

namespace sig = opdump::sig;

// A float type whose NaNs the fingerprint canonicalises (signature_device.cpp's
// words_of: float16, bfloat16, float32, float64 and the parts of complex).
template <typename R>
constexpr bool kCanonicalNan = std::is_same_v<R, float> || std::is_same_v<R, double> ||
                               std::is_same_v<R, c10::Half> || std::is_same_v<R, c10::BFloat16>;

template <int N>
using Bits = std::conditional_t<N == 1, uint8_t, std::conditional_t<N == 2, uint16_t,
             std::conditional_t<N == 4, uint32_t, uint64_t>>>;

// The fingerprint and sketch of one tensor, fed its elements in logical
// order: exact sums in the definition's order, so no pieces to merge. The
// host alias has no conjugate or negative bit, and needs none: the
// dispatcher's Conjugate and Negative fallbacks resolve such views (a clone,
// a launch of its own) before a kernel sees them.
struct Signer {
  // The fingerprint: word w times ((block_key(w) XOR lane key) | 1).
  uint64_t f = 0;
  uint64_t word = 0;
  uint64_t key_block = ~uint64_t{0};
  uint32_t block_key = 0;
  // The sketch: element e of group g = e >> lg, at r = e & (k - 1), signed by
  // bit r of a_g, into y[r XOR c_g].
  int k, lg;
  uint64_t element = 0;
  uint64_t group = ~uint64_t{0};
  uint32_t a = 0, c = 0;
  double y[sig::kMaxSketch] = {};

  explicit Signer(int k_) : k(k_), lg(__builtin_ctz(static_cast<unsigned>(k_))) {}

  void add_word(uint32_t u) {
    if ((word >> 6) != key_block) {
      key_block = word >> 6;
      block_key = sig::block_key(word);
    }
    const uint32_t key = (block_key ^ sig::kLaneKeys.k[word & (sig::kBlockWords - 1)]) | 1u;
    f += static_cast<uint64_t>(u) * key;
    ++word;
  }

  // One real value (an element, or a part of a complex one) as words.
  template <typename R>
  void add_part(R v) {
    constexpr int N = sizeof(R);
    Bits<N> bits;
    std::memcpy(&bits, &v, N);
    if constexpr (kCanonicalNan<R>) {
      if (at::_isnan(v)) {
        // What masked_fill(isnan(x), nan) writes.
        static const R canonical = c10::Scalar(std::numeric_limits<double>::quiet_NaN()).to<R>();
        std::memcpy(&bits, &canonical, N);
      }
    }
    if constexpr (N == 8) {
      add_word(static_cast<uint32_t>(bits));
      add_word(static_cast<uint32_t>(bits >> 32));
    } else {
      add_word(static_cast<uint32_t>(bits));
    }
  }

  template <typename T>
  void add_words(const T& v) {
    if constexpr (c10::is_complex<T>::value) {
      add_part(v.real());
      add_part(v.imag());
    } else {
      add_part(v);
    }
  }

  // `x`: the element as the statistics see it (to_double).
  void add_value(double x) {
    const uint64_t g = element >> lg;
    if (g != group) {
      group = g;
      const uint32_t h = static_cast<uint32_t>(g) * sig::kGolden;
      a = sig::fmix32(h + sig::kSignSeed);
      c = sig::fmix32(h + sig::kProjSeed) & static_cast<uint32_t>(k - 1);
    }
    const uint32_t r = static_cast<uint32_t>(element) & static_cast<uint32_t>(k - 1);
    if (!std::isfinite(x)) x = 0.0;
    // -x where bit r of a is set, by its sign bit: a random sign would
    // mispredict as a branch half the time.
    uint64_t bits;
    std::memcpy(&bits, &x, 8);
    bits ^= static_cast<uint64_t>((a >> r) & 1u) << 63;
    std::memcpy(&x, &bits, 8);
    y[r ^ c] += x;
    ++element;
  }

  // A run of `n` elements at `p`, `stride` bytes apart, whose values are x.
  // Works on a local copy, whose state the compiler keeps in registers (this
  // one's fields might alias the run's bytes), with a loop for each sum.
  template <typename T>
  void add_run(const char* p, int64_t stride, const double* x, int64_t n) {
    Signer s = *this;
    for (int64_t i = 0; i < n; ++i) s.add_words(*reinterpret_cast<const T*>(p + i * stride));
    for (int64_t i = 0; i < n; ++i) s.add_value(x[i]);
    *this = s;
  }
};

// The statistics of `t` into `acc` and, when `signer` is given, its
// fingerprint and sketch, in one pass over its host alias. No launch of its
// own: the caller's kernel is the launch.
void measure(const at::Tensor& t, Acc& acc, Signer* signer) {
  const at::Tensor h = host_alias(t);
  if (h.numel() == 0) return;
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
              if (signer != nullptr) signer->add_run<scalar_t>(p, strides[0], block + filled, take);
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

void write_stats(const Acc& acc, double* v) {
  const double values[8] = {static_cast<double>(acc.finite), static_cast<double>(acc.nan),
                            static_cast<double>(acc.posinf), static_cast<double>(acc.zero),
                            acc.min, acc.max, acc.mean, acc.m2};
  std::copy(values, values + 8, v);
}

at::Tensor fused_stats(const at::Tensor& t) {
  Launch launch;
  Acc acc;
  measure(t, acc, nullptr);
  at::Tensor row = at::empty({8}, t.options().dtype(at::kDouble));
  write_stats(acc, host_alias(row).mutable_data_ptr<double>());
  return row;
}

// opdump::fused_stats_batch(Tensor[] tensors, int sketch=0) -> Tensor: one
// row per tensor, [the 8 statistics, then with sketch K > 0: P0, P1, P2,
// y_0 .. y_{K-1}], the fingerprint F = P0 + P1 * 2^16 + P2 * 2^32 given as
// P0 = F mod 2^32, P1 = 0, P2 = F >> 32 (each exact in float64).
at::Tensor fused_stats_batch(at::TensorList tensors, int64_t sketch) {
  Launch launch;
  TORCH_CHECK(sketch == 0 || (sketch >= 2 && sketch <= sig::kMaxSketch && (sketch & (sketch - 1)) == 0),
              "opdump::fused_stats_batch: sketch must be 0 or a power of two from 2 to ",
              sig::kMaxSketch, ", got ", sketch);
  TORCH_CHECK(!tensors.empty(), "opdump::fused_stats_batch: no tensors (nothing names the device)");
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.device().type() == kDev, "opdump::fused_stats_batch: every tensor must be on testdev, got one on ",
                t.device());
  }
  const int64_t n = static_cast<int64_t>(tensors.size());
  const int64_t width = 8 + (sketch > 0 ? 3 + sketch : 0);
  at::Tensor out = at::empty({n, width}, tensors[0].options().dtype(at::kDouble));
  double* rows = host_alias(out).mutable_data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    double* v = rows + i * width;
    Acc acc;
    std::optional<Signer> signer;
    if (sketch > 0) signer.emplace(static_cast<int>(sketch));
    measure(tensors[i], acc, signer ? &*signer : nullptr);
    write_stats(acc, v);
    if (signer) {
      v[8] = static_cast<double>(signer->f & 0xffffffffu);
      v[9] = 0.0;
      v[10] = static_cast<double>(signer->f >> 32);
      std::copy(signer->y, signer->y + sketch, v + 11);
    }
  }
  return out;
}

// testdev::fused_batch_enabled(), defined here with the switch it reports.
bool op_fused_batch_enabled() {
  return fused_batch_enabled();
}

}  // namespace

bool fused_stats_enabled() {
  static const bool on = env_switch("TESTDEV_FUSED_STATS", true);
  return on;
}

bool fused_batch_enabled() {
  // Read (and a bad value reported) even when fused_stats is off.
  static const bool on = env_switch("TESTDEV_FUSED_BATCH", true);
  return on && fused_stats_enabled();
}

void register_fused_stats(torch::Library& opdump_impl) {
  if (fused_stats_enabled()) opdump_impl.impl("fused_stats", TORCH_FN(fused_stats));
  if (fused_batch_enabled()) opdump_impl.impl("fused_stats_batch", TORCH_FN(fused_stats_batch));
  // Lives for the process, as testdev.cpp's libraries do.
  static const torch::Library* control = [] {
    auto* lib = new torch::Library(torch::Library::FRAGMENT, "testdev", std::nullopt, __FILE__, __LINE__);
    lib->def("fused_batch_enabled() -> bool", TORCH_FN(op_fused_batch_enabled));
    return lib;
  }();
  (void)control;
}

}  // namespace testdev
