// The reductions behind device_reduce.h: in pieces, over a staging buffer,
// or by a backend's own kernel.

#include "opdump/cpp/device/device_reduce.h"

#include <array>
#include <atomic>
#include <limits>
#include <tuple>

#include <ATen/ATen.h>

#include "opdump/cpp/stats/stats_acc.h"

namespace opdump::devstats {

namespace {

// Whether the backend of `t` registered a kernel for `op`, asked once per
// device type in `known` (0: not asked yet, 1: none, 2: registered):
// backends register theirs when they load, before their tensors are
// measured.
using Known = std::array<std::atomic<uint8_t>, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>;
bool registered(const c10::OperatorHandle& op, const at::Tensor& t, Known& known) {
  auto& k = known[static_cast<size_t>(t.device().type())];
  uint8_t v = k.load(std::memory_order_relaxed);
  if (v == 0) {
    v = op.hasKernelForDispatchKey(c10::legacyExtractDispatchKey(t.key_set())) ? 2 : 1;
    k.store(v, std::memory_order_relaxed);
  }
  return v == 2;
}

}  // namespace

// The backend's kernel for opdump::fused_stats, where it registered one
// (device_stats.h).
const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&)>* fused_kernel(const at::Tensor& t) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opdump::fused_stats", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  static Known known{};
  return registered(op, t, known) ? &op : nullptr;
}

const c10::TypedOperatorHandle<at::Tensor(at::TensorList, int64_t)>* batch_kernel(const at::Tensor& t) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opdump::fused_stats_batch", "")
                             .typed<at::Tensor(at::TensorList, int64_t)>();
  static Known known{};
  return registered(op, t, known) ? &op : nullptr;
}

// The row of one piece, launched on the current stream. Non-finite values
// are replaced by the mean of the finite ones, which leaves the extremes, the
// mean and the spread of the finite values as they are, so one var_mean and
// one aminmax serve tensors with and without NaN or infinities. Alive at
// once at most: the float64 piece, the replaced copy and a mask.
at::Tensor piece_row(const at::Tensor& piece, at::ScalarType acc) {
  const at::Tensor x = (piece.is_complex() ? at::abs(piece) : piece).to(acc);
  at::Tensor finite, mean, count;
  {
    const at::Tensor zeroed = at::nan_to_num(x, 0.0, 0.0, 0.0);
    finite = at::eq(zeroed, x);
    count = finite.sum(acc);
    mean = at::div(zeroed.sum(), count);  // NaN when nothing is finite
  }
  at::Tensor var, mu, lo, hi;
  {
    const at::Tensor replaced = at::where(finite, x, mean);
    finite.reset();
    std::tie(var, mu) = at::var_mean(replaced, at::OptionalIntArrayRef(), std::optional<at::Scalar>(at::Scalar(0)), false);
    std::tie(lo, hi) = at::aminmax(replaced);
  }
  const auto inf = std::numeric_limits<double>::infinity();
  // The replaced elements sit at the mean: n times the variance over all n
  // elements is the finite values' sum of squared deviations.
  const at::Tensor m2 = at::mul(var, static_cast<double>(piece.numel()));
  return at::stack({count, at::ne(x, x).sum(acc), at::eq(x, inf).sum(acc), at::eq(x, 0).sum(acc), lo, hi, mu, m2});
}

// The rows of the staged tensors `x` (float64, one after the other, of
// `lengths` elements), as piece_row gives them, with segment reductions over
// the whole buffer: non-finite values are replaced by their tensor's finite
// mean, spread back over the elements with repeat_interleave.
at::Tensor segment_rows(const at::Tensor& x, const at::Tensor& lengths) {
  auto seg = [&](const at::Tensor& v, c10::string_view how) {
    // unsafe: no check of the lengths, which would wait for the device.
    return at::segment_reduce(v, how, lengths, std::nullopt, std::nullopt, 0, /*unsafe=*/true);
  };
  const auto inf = std::numeric_limits<double>::infinity();
  const at::ScalarType acc = x.scalar_type();
  at::Tensor finite, count, sum, zeros, nans, pinf;
  {
    const at::Tensor zeroed = at::nan_to_num(x, 0.0, 0.0, 0.0);
    finite = at::eq(zeroed, x);
    count = seg(finite.to(acc), "sum");
    sum = seg(zeroed, "sum");
  }
  zeros = seg(at::eq(x, 0).to(acc), "sum");
  nans = seg(at::ne(x, x).to(acc), "sum");
  pinf = seg(at::eq(x, inf).to(acc), "sum");
  const at::Tensor mean = at::div(sum, count);  // NaN when nothing is finite
  at::Tensor lo, hi, m2;
  {
    const at::Tensor spread = at::repeat_interleave(mean, lengths, 0, x.numel());
    const at::Tensor replaced = at::where(finite, x, spread);
    finite.reset();
    const at::Tensor dev = at::sub(replaced, spread);
    m2 = seg(at::mul(dev, dev), "sum");
    lo = seg(replaced, "min");
    hi = seg(replaced, "max");
  }
  return at::stack({count, nans, pinf, zeros, lo, hi, mean, m2}, 1);
}

// The statistics of one piece from its row.
Acc piece_acc(const double* v, int64_t n) {
  Acc a;
  const auto count = static_cast<int64_t>(v[0]);
  a.nan = static_cast<int64_t>(v[1]);
  a.posinf = static_cast<int64_t>(v[2]);
  a.neginf = n - count - a.nan - a.posinf;
  a.zero = static_cast<int64_t>(v[3]);
  if (count > 0) {
    a.finite = count;
    a.min = v[4];
    a.max = v[5];
    a.mean = v[6];
    a.m2 = v[7];
    a.sum = v[6] * static_cast<double>(count);
    a.sumsq = a.m2 + static_cast<double>(count) * v[6] * v[6];
  }
  return a;
}

}  // namespace opdump::devstats
