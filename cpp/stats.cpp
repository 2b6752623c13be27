// Statistics of one tensor, computed on the tensor's own device.
//
// - CPU: one pass over the elements, accumulating in float64, with no float
//   copy of the tensor (dense tensors of any layout are read in memory order,
//   since every statistic is order-independent).
// - Other devices: ATen reductions on the device in float64 (float32 where
//   the device has no float64), stacked into one small tensor that is copied
//   to the host once. That copy synchronises the device, so the record is final.
//
// The ops run here are invisible to autograd, autocast, user modes and opdump
// itself (see stats_excluded_keys).

#include <cmath>
#include <complex>
#include <limits>
#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/Dispatch_v2.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/internal.h"
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

// Running sums over finite values. Variance uses sums shifted by the first
// finite value, which avoids the cancellation of sum(x^2) - n*mean^2 when the
// mean is large against the spread.
struct Acc {
  int64_t finite = 0, nan = 0, posinf = 0, neginf = 0, zero = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double absmax = 0, sum = 0, sumsq = 0;
  double shift = 0, dsum = 0, dsumsq = 0;

  inline void add(double x) {
    if (std::isnan(x)) {
      ++nan;
      return;
    }
    if (std::isinf(x)) {
      if (x > 0) ++posinf; else ++neginf;
      return;
    }
    if (finite == 0) shift = x;
    ++finite;
    zero += (x == 0.0);
    min = x < min ? x : min;
    max = x > max ? x : max;
    const double a = std::fabs(x);
    absmax = a > absmax ? a : absmax;
    sum += x;
    sumsq += x * x;
    const double d = x - shift;
    dsum += d;
    dsumsq += d * d;
  }

  void write(TensorRow& row) const {
    row.nan_count = nan;
    row.posinf_count = posinf;
    row.neginf_count = neginf;
    row.zero_count = zero;
    row.l2 = std::sqrt(sumsq);
    if (finite == 0) {
      row.min = row.max = row.mean = row.std = row.absmax = kNaN;
      return;
    }
    const double n = static_cast<double>(finite);
    row.min = min;
    row.max = max;
    row.absmax = absmax;
    row.mean = sum / n;
    const double dm = dsum / n;
    const double var = dsumsq / n - dm * dm;
    row.std = std::sqrt(var > 0 ? var : 0.0);
  }
};

template <typename T>
inline double to_double(T v) {
  if constexpr (c10::is_complex<T>::value) {
    return std::abs(std::complex<double>(static_cast<double>(v.real()), static_cast<double>(v.imag())));
  } else {
    return static_cast<double>(v);
  }
}

void measure_cpu(const at::Tensor& t, TensorRow& row) {
  // Dense tensors (contiguous, transposed, permuted) occupy exactly numel
  // elements of memory: read them in memory order. Others (expanded,
  // sliced) are first made contiguous, in their own dtype.
  at::Tensor src = t;
  if (src.is_neg()) src = src.resolve_neg();
  if (!src.is_non_overlapping_and_dense()) src = src.contiguous();
  const int64_t n = src.numel();
  Acc acc;
  AT_DISPATCH_V2(src.scalar_type(), "opdump_stats", AT_WRAP([&] {
    const auto* p = static_cast<const scalar_t*>(src.const_data_ptr());
    for (int64_t i = 0; i < n; ++i) acc.add(to_double(p[i]));
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kBool,
      AT_EXPAND(AT_FLOAT8_TYPES), AT_EXPAND(AT_BAREBONES_UNSIGNED_TYPES), at::kComplexHalf);
  acc.write(row);
}

void measure_device(const at::Tensor& t, TensorRow& row) {
  at::Tensor x = t.is_complex() ? at::abs(t) : t;
  const bool has_f64 = !t.device().is_mps();
  x = x.to(has_f64 ? at::kDouble : at::kFloat);
  const auto inf = std::numeric_limits<double>::infinity();
  auto finite = at::isfinite(x);
  auto fin = at::where(finite, x, at::zeros({}, x.options()));
  auto count = finite.sum().to(x.scalar_type());
  auto sum = fin.sum();
  auto mean = sum / count;
  auto dev = at::where(finite, x - mean, at::zeros({}, x.options()));
  auto parts = at::stack({
      at::isnan(x).sum().to(x.scalar_type()),
      at::isposinf(x).sum().to(x.scalar_type()),
      at::isneginf(x).sum().to(x.scalar_type()),
      (x == 0).sum().to(x.scalar_type()),
      count,
      at::where(finite, x, at::full({}, inf, x.options())).min(),
      at::where(finite, x, at::full({}, -inf, x.options())).max(),
      fin.abs().max(),
      sum,
      (fin * fin).sum(),
      (dev * dev).sum(),
  });
  // One copy to the host; it waits for the device.
  auto host = parts.to(at::kCPU, at::kDouble).contiguous();
  const double* v = host.const_data_ptr<double>();
  row.nan_count = static_cast<int64_t>(v[0]);
  row.posinf_count = static_cast<int64_t>(v[1]);
  row.neginf_count = static_cast<int64_t>(v[2]);
  row.zero_count = static_cast<int64_t>(v[3]);
  const double n = v[4];
  row.l2 = std::sqrt(v[9]);
  if (n == 0) {
    row.min = row.max = row.mean = row.std = row.absmax = kNaN;
    return;
  }
  row.min = v[5];
  row.max = v[6];
  row.absmax = v[7];
  row.mean = v[8] / n;
  row.std = std::sqrt(v[10] / n);
}

// Tensors whose values opdump cannot or must not read: metadata only.
bool unsupported(const at::Tensor& t) {
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

void fill_metadata(const at::Tensor& t, TensorRow& row) {
  // The name Python prints without "torch.": float32, bfloat16, int64.
  row.dtype = rust::String(std::string(c10::getDtypeNames(t.scalar_type()).first));
  for (auto s : t.sym_sizes()) row.shape.push_back(s.is_symbolic() ? -1 : s.as_int_unchecked());
  if (t.layout() == at::kStrided && !t.is_nested())
    for (auto s : t.sym_strides()) row.stride.push_back(s.is_symbolic() ? -1 : s.as_int_unchecked());
  row.device = rust::String(t.device().str());
  row.numel = t.sym_numel().is_symbolic() ? -1 : t.sym_numel().as_int_unchecked();
}

void null_stats(TensorRow& row) {
  row.min = row.max = row.mean = row.std = row.l2 = row.absmax = kNaN;
  row.nan_count = row.posinf_count = row.neginf_count = row.zero_count = 0;
}

}  // namespace

void measure(const at::Tensor& t, bool values_defined, TensorRow& row, Status no_values) {
  null_stats(row);
  try {
    fill_metadata(t, row);
  } catch (const std::exception&) {
    row.status = kUnsupported;
    return;
  }
  if (unsupported(t)) {
    row.status = kUnsupported;
    return;
  }
  if (!values_defined) {
    row.status = no_values;
    return;
  }
  if (t.numel() == 0) {  // nothing to reduce: zero counts, no extremes
    null_stats(row);
    row.l2 = 0;
    row.status = kComputed;
    return;
  }
  try {
    c10::impl::ExcludeDispatchKeyGuard guard(stats_excluded_keys());
    if (t.device().is_cpu())
      measure_cpu(t, row);
    else
      measure_device(t, row);
    row.status = kComputed;
  } catch (const std::exception&) {
    null_stats(row);
    row.status = kFailed;
  }
}

}  // namespace opdump

