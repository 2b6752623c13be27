// Statistics of one tensor, computed on the tensor's own device.
//
// - CPU: L1-sized blocks, accumulating in float64, with the AVX-512 kernel
//   for float32 and the AVX2 kernel where the CPU has them (one pass:
//   extremes, counts, and the sums of the values, or of the deviations
//   from the block's first value, and of their squares; the
//   portable path for blocks with NaN or infinities takes two), and no
//   full-size float copy (dense tensors of any layout are read in memory
//   order, since every statistic is order-independent).
// - Other devices: ATen reductions on the device, in pieces of bounded size,
//   whose results come back later without a wait on the job's thread
//   (device_stats.cpp); the row waits for them.
//
// The ops run here are invisible to autograd, autocast, user modes and opdump
// itself (see stats_excluded_keys).

#include <cmath>
#include <complex>
#include <limits>
#include <optional>
#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/common/chunked.h"
#include "opdump/cpp/device/device_stats.h"
#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/rows/rows.h"
#include "opdump/cpp/signature/signature_cpu.h"
#include "opdump/cpp/stats/parts.h"
#include "opdump/cpp/stats/stats.h"
#include "opdump/cpp/stats/stats_acc.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

c10::DispatchKeySet stats_excluded_keys() {
  static const c10::DispatchKeySet keys =
      c10::DispatchKeySet(kHookKey) | c10::autograd_dispatch_keyset |
      c10::autocast_dispatch_keyset |
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                           c10::DispatchKey::PythonDispatcher, c10::DispatchKey::PreDispatch,
                           c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
                           c10::DispatchKey::FuncTorchDynamicLayerBackMode,
                           c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::Functionalize});
  return keys;
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Adds `m` finite values (the portable path; blocks are converted to float64
// first). Eight independent lanes per sum: a single floating-point
// accumulator is one long dependency chain that the compiler may not
// reorder, so it neither pipelines nor vectorises. A first pass sums and
// finds the extremes, a second takes the squared deviations from the block's
// own mean; blocks merge with Chan's formula (Acc::merge).
void add_finite(Acc& acc, const double* x, int64_t m) {
  if (m == 0) return;
  constexpr int L = 8;
  double s[L] = {}, s2[L] = {}, mn[L], mx[L];
  int64_t z[L] = {};
  for (int l = 0; l < L; ++l) mn[l] = mx[l] = x[0];
  int64_t i = 0;
  for (; i + L <= m; i += L) {
    for (int l = 0; l < L; ++l) {
      const double v = x[i + l];
      s[l] += v;
      s2[l] += v * v;
      mn[l] = v < mn[l] ? v : mn[l];
      mx[l] = v > mx[l] ? v : mx[l];
      z[l] += v == 0.0;
    }
  }
  for (; i < m; ++i) {
    const double v = x[i];
    s[0] += v;
    s2[0] += v * v;
    mn[0] = v < mn[0] ? v : mn[0];
    mx[0] = v > mx[0] ? v : mx[0];
    z[0] += v == 0.0;
  }
  Acc b;
  b.finite = m;
  b.min = mn[0];
  b.max = mx[0];
  for (int l = 0; l < L; ++l) {
    b.sum += s[l];
    b.sumsq += s2[l];
    b.zero += z[l];
    b.min = mn[l] < b.min ? mn[l] : b.min;
    b.max = mx[l] > b.max ? mx[l] : b.max;
  }
  b.mean = b.sum / static_cast<double>(m);
  double d2[L] = {};
  i = 0;
  for (; i + L <= m; i += L)
    for (int l = 0; l < L; ++l) {
      const double d = x[i + l] - b.mean;
      d2[l] += d * d;
    }
  for (; i < m; ++i) {
    const double d = x[i] - b.mean;
    d2[0] += d * d;
  }
  for (int l = 0; l < L; ++l) b.m2 += d2[l];
  acc.merge(b);
}

template <typename T>
inline double to_double(T v) {
  if constexpr (c10::is_complex<T>::value) {
    return std::abs(std::complex<double>(static_cast<double>(v.real()), static_cast<double>(v.imag())));
  } else {
    return static_cast<double>(v);
  }
}

constexpr int64_t kBlock = 1024;

// One block: converted into a buffer; blocks without NaN or Inf (the common
// case) take no per-element branch.
template <typename T>
void add_block(const T* p, int64_t m, Acc& acc) {
  double buf[kBlock];
  double check[8] = {};  // NaN if any element is NaN or infinite
  for (int64_t i = 0; i < m; ++i) {
    buf[i] = to_double(p[i]);
    check[i & 7] += buf[i] * 0.0;
  }
  double any = 0;
  for (double c : check) any += c;
  if (any == 0.0) {
    add_finite(acc, buf, m);
    return;
  }
  int64_t k = 0;
  for (int64_t i = 0; i < m; ++i) {
    const double v = buf[i];
    if (std::isnan(v)) {
      ++acc.nan;
    } else if (std::isinf(v)) {
      if (v > 0) ++acc.posinf; else ++acc.neginf;
    } else {
      buf[k++] = v;
    }
  }
  add_finite(acc, buf, k);
}

// The vector kernel for the floating-point types where the CPU has one;
// false when it has none, or for a float64 block that holds NaN or
// infinities.
template <typename T>
bool fast_block(const T* p, int64_t m, Acc& acc) {
#if STATS_HAVE_AVX2
  if (!avx2::usable()) return false;
  if constexpr (std::is_same_v<T, float>) {
    if (avx512::usable() && avx512::add_block(p, m, acc)) return true;
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return avx2::add_block(p, m, acc);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return avx2::add_block_bf16(reinterpret_cast<const uint16_t*>(p), m, acc);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return avx2::add_block_f16(reinterpret_cast<const uint16_t*>(p), m, acc);
  }
#endif
  return false;
}

// The fingerprint and sketch asked of a tensor whose memory is in logical
// order: each block is added to them as well, while it is in L1.
struct SignatureSpec {
  sig::Words words;
  int per_element;
  int k;
};

// The statistics of a run and, when asked, its signature.
struct Measured {
  Acc acc;
  sig::Signature sig;
  void merge(const Measured& o) {
    acc.merge(o.acc);
    sig.merge(o.sig);
  }
};

// float32 with a sketch of 16, the default length, where the CPU has AVX2:
// one kernel takes a block's statistics, fingerprint and sketch from the
// same loads (about 30% less time than the three kernels in turn:
// scripts/bench/signature_kernels.cpp).
// Blocks start at multiples of 16, as the one pass needs: chunks and blocks
// are multiples of it. (avx2::usable() implies the signature's AVX2 too.)
static_assert(kChunk % kBlock == 0 && kBlock % 16 == 0);

template <typename T>
bool signed_block(const T* p, int64_t s, int64_t b, Acc& acc, SignatureRun& r) {
#if STATS_HAVE_AVX2
  if constexpr (std::is_same_v<T, float>) {
    if (r.sig.k != 16 || !avx2::usable()) return false;
    if (!avx2::add_block_signed(p + s, b, static_cast<uint64_t>(s), acc, r.sig, r.st)) return false;
    const int64_t done = b - b % 16;
    if (done < b) r.add(p, s + done, b - done);
    return true;
  }
#endif
  (void)p, (void)s, (void)b, (void)acc, (void)r;
  return false;
}

template <typename T>
Measured accumulate(const T* p, int64_t n, const SignatureSpec& spec) {
  Measured total;
  total.sig.k = spec.k;
  return chunked(n, total, [&](int64_t first, int64_t len) {
    Measured m;
    SignatureRun r(spec.words, spec.per_element, spec.k);
    for (int64_t s = first; s < first + len; s += kBlock) {
      const int64_t b = std::min(kBlock, first + len - s);
      if (signed_block(p, s, b, m.acc, r)) continue;
      if (!fast_block(p + s, b, m.acc)) add_block(p + s, b, m.acc);
      r.add(p, s, b);
    }
    m.sig = r.finish();
    return m;
  });
}

// The statistics alone: no Measured, whose signature (a sketch of up to 32
// doubles) would be zeroed and copied for every tensor and chunk.
template <typename T>
Acc accumulate_stats(const T* p, int64_t n) {
  return chunked(n, Acc{}, [&](int64_t first, int64_t len) {
    Acc acc;
    for (int64_t s = first; s < first + len; s += kBlock) {
      const int64_t b = std::min(kBlock, first + len - s);
      if (!fast_block(p + s, b, acc)) add_block(p + s, b, acc);
    }
    return acc;
  });
}

// A contiguous copy of `t` in a buffer kept per thread: a fresh allocation
// of this size is mapped and zeroed by the kernel page by page, every time.
at::Tensor contiguous_copy(const at::Tensor& t) {
  constexpr int64_t kMaxKeptBytes = int64_t{64} << 20;
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  if (bytes > kMaxKeptBytes) return t.contiguous();
  thread_local at::Tensor buffer;
  if (!buffer.defined() || buffer.nbytes() < static_cast<size_t>(bytes))
    buffer = at::empty({std::max<int64_t>(bytes, 1 << 16)}, at::TensorOptions().dtype(at::kByte));
  at::Tensor out = at::from_blob(buffer.data_ptr(), t.sizes(), t.options());
  out.copy_(t);
  return out;
}

void measure_cpu(const at::Tensor& t, TensorRow& row) {
  // Dense tensors (contiguous, transposed, permuted) occupy exactly numel
  // elements of memory: read them in memory order. Others (expanded,
  // sliced) are first made contiguous, in their own dtype.
  at::Tensor src = t;
  if (src.is_neg()) src = src.resolve_neg();
  if (!src.is_non_overlapping_and_dense()) src = contiguous_copy(src);
  const int64_t n = src.numel();
  // The fingerprint and the sketch read the values in logical order: in the
  // same pass when memory is in that order, else from a copy below.
  const int k = sketch_size_once();
  SignatureSpec spec{};
  spec.k = k;
  const bool fused = k > 0 && src.is_contiguous() && !src.is_conj() &&
                     signature_words(src.scalar_type(), spec.words, spec.per_element);
  AT_DISPATCH_V2(src.scalar_type(), "opdump_stats", AT_WRAP([&] {
    const auto* p = static_cast<const scalar_t*>(src.const_data_ptr());
    if (fused) {
      const Measured m = accumulate(p, n, spec);
      row.stats = stats_of(m.acc);
      signature_to_row(m.sig, row);
    } else {
      row.stats = stats_of(accumulate_stats(p, n));
    }
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kBool,
      AT_EXPAND(AT_FLOAT8_TYPES), AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES), at::kComplexHalf);
  if (!fused && k > 0) {
    if (src.is_conj()) src = src.resolve_conj();
    measure_signature_cpu(src.is_contiguous() ? src : contiguous_copy(src), k, row);
  }
}

}  // namespace

int sketch_size_once() {
  static const int k = sketch_size();
  return k;
}

bool values_unreadable(const at::Tensor& t) {
  if (t.is_meta() || t.layout() != at::kStrided || t.is_quantized() || t.is_nested()) return true;
  const auto ks = t.key_set();
  // Python subclasses (FakeTensor, ...), functorch and functionalization
  // wrappers, zero tensors: their storage is not their values.
  if (ks.has(c10::DispatchKey::Python) || ks.has(c10::DispatchKey::FuncTorchBatched) ||
      ks.has(c10::DispatchKey::FuncTorchGradWrapper) || ks.has(c10::DispatchKey::Functionalize) ||
      ks.has(c10::DispatchKey::ZeroTensor))
    return true;
  if (!t.has_storage()) return true;
  return t.numel() > 0 && t.storage().data() == nullptr;
}

namespace {

// Sizes and strides of up to kInlineDims dimensions go in the row's
// array (TensorRow::dims in the bridge): a push onto a rust::Vec is four
// calls into Rust, a dozen or so per row.
constexpr size_t kInlineDims = 8;
static_assert(sizeof(TensorRow::dims) == 2 * kInlineDims * sizeof(int64_t));

int64_t concrete(const c10::SymInt& s) { return s.is_symbolic() ? -1 : s.as_int_unchecked(); }

void fill_metadata(const at::Tensor& t, TensorRow& row) {
  row.dtype_id = dtype_name_id(t.scalar_type());
  const auto sizes = t.sym_sizes();
  row.strided = t.layout() == at::kStrided && !t.is_nested();
  if (sizes.size() <= kInlineDims) {
    row.rank = static_cast<int32_t>(sizes.size());
    for (size_t d = 0; d < sizes.size(); ++d) row.dims[d] = concrete(sizes[d]);
    if (row.strided) {
      const auto strides = t.sym_strides();
      for (size_t d = 0; d < strides.size() && d < kInlineDims; ++d) row.dims[kInlineDims + d] = concrete(strides[d]);
    }
  } else {
    row.rank = -1;
    row.shape.reserve(sizes.size());
    for (auto s : sizes) row.shape.push_back(concrete(s));
    if (row.strided) {
      const auto strides = t.sym_strides();
      row.stride.reserve(strides.size());
      for (auto s : strides) row.stride.push_back(concrete(s));
    }
  }
  row.device_id = device_name_id(t.device());
  row.numel = t.sym_numel().is_symbolic() ? -1 : t.sym_numel().as_int_unchecked();
}

void null_stats(TensorRow& row) { null_stats(row.stats); }

// A device tensor: launched now, complete later. The row waits, unless the
// device is capturing a graph or the pool of pending results is full.
void measure_device(const at::Tensor& t, TensorRow& row, Later& later, bool remember) {
  DeviceResultPtr result;
  switch (device_measure(t, result)) {
    case DeviceLaunch::Capturing:
      row.status = StatsStatus::Capturing;
      return;
    case DeviceLaunch::Dropped:
      row.status = StatsStatus::Dropped;
      return;
    case DeviceLaunch::Queued:
      break;
  }
  if (device_wait_for(result, later, StatsStatus::Computed, 1, row)) {
    later.result = result;
    later.repeat = 1;
    row.status = StatsStatus::Computed;  // until its values come
  }
  if (remember) reuse_remember(t, row, result, 1);
}

}  // namespace

TensorStats stats_of(const Acc& acc) {
  TensorStats s{};
  s.nan_count = acc.nan;
  s.posinf_count = acc.posinf;
  s.neginf_count = acc.neginf;
  s.zero_count = acc.zero;
  s.l2 = std::sqrt(acc.sumsq);
  if (acc.finite == 0) {
    s.min = s.max = s.mean = s.std = s.absmax = kNaN;
    return s;
  }
  s.min = acc.min;
  s.max = acc.max;
  s.absmax = std::max(std::fabs(acc.min), std::fabs(acc.max));
  s.mean = acc.sum / static_cast<double>(acc.finite);
  s.std = std::sqrt(acc.m2 / static_cast<double>(acc.finite));
  return s;
}

void null_stats(TensorStats& s) {
  s.min = s.max = s.mean = s.std = s.l2 = s.absmax = kNaN;
  s.nan_count = s.posinf_count = s.neginf_count = s.zero_count = 0;
}

// Every element repeated `k` times: the same extremes, mean and spread, `k`
// times the counts, and the norm sqrt(k) times.
void scale_repeated(TensorStats& s, int64_t k) {
  s.nan_count *= k;
  s.posinf_count *= k;
  s.neginf_count *= k;
  s.zero_count *= k;
  s.l2 *= std::sqrt(static_cast<double>(k));
}

void measure(const at::Tensor& t, bool values_defined, TensorRow& row, StatsStatus no_values, bool lookup,
             bool remember, Later* later) {
  null_stats(row);
  try {
    fill_metadata(t, row);
  } catch (const std::exception&) {
    row.status = StatsStatus::Unsupported;
    return;
  }
  if (values_unreadable(t)) {
    row.status = StatsStatus::Unsupported;
    return;
  }
  if (!values_defined) {
    row.status = no_values;
    return;
  }
  if (t.numel() == 0) {  // nothing to reduce: zero counts, no extremes
    null_stats(row);
    row.stats.l2 = 0;
    row.status = StatsStatus::Computed;
    return;
  }
  if (lookup) {
    DeviceResultPtr pending;
    int64_t repeat = 1;
    bool pending_signature = true;
    if (reuse_lookup(t, row, pending, repeat, pending_signature)) {
      row.status = StatsStatus::Reused;
      if (later != nullptr) later->signature = pending_signature;
      if (pending && later != nullptr && device_wait_for(pending, *later, StatsStatus::Reused, repeat, row)) {
        later->result = pending;
        later->repeat = repeat;
      }
      if (!pending || later != nullptr) return;
    }
  }
  try {
    c10::impl::ExcludeDispatchKeyGuard guard(stats_excluded_keys());
    if (t.device().is_cpu()) {
      measure_cpu(t, row);
      row.status = StatsStatus::Computed;
      if (remember) reuse_remember(t, row);
    } else if (later != nullptr) {
      measure_device(t, row, *later, remember);
    } else {
      row.status = StatsStatus::NotMeasured;  // no call to wait in
    }
  } catch (const std::exception&) {
    null_stats(row);
    row.status = StatsStatus::Failed;
  }
}

}  // namespace opdump

