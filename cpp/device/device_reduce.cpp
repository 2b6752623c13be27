// The reductions behind device_reduce.h: in pieces, over a staging buffer,
// or by a backend's own kernel.

#include "opdump/cpp/device/device_reduce.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>
#include <tuple>

#include <ATen/ATen.h>

#include "opdump/cpp/device/device_batch.h"
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

// `n` NaN values (n < kRowWidth) of `opts`, for the padding of staged
// rows: a slice of a row made once per device and dtype and kept for the
// process (never freed: torch may be gone at exit).
at::Tensor row_padding(const at::TensorOptions& opts, int64_t n) {
  static std::mutex mu;
  static auto* kept = new std::vector<at::Tensor>;
  at::Tensor row;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& t : *kept)
      if (t.device() == opts.device() && t.scalar_type() == opts.dtype().toScalarType()) row = t;
    if (!row.defined()) {
      row = at::full({kRowWidth}, std::numeric_limits<double>::quiet_NaN(), opts);
      kept->push_back(row);
    }
  }
  return row.narrow(0, 0, n);
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

namespace {

// What row_stats keeps on each device for the process (never freed: torch
// may be gone at exit): the boundaries that sort a float64 value into its
// class, the counts each class adds, and the start of every row of a
// staging buffer, for the bags of embedding_bag.
struct RowTables {
  at::Tensor bounds, counts, starts;
};
const RowTables& row_tables(const at::TensorOptions& opts, int64_t rows) {
  static std::mutex mu;
  static auto* kept = new std::unordered_map<c10::Device, RowTables>;
  std::lock_guard<std::mutex> lock(mu);
  RowTables& t = (*kept)[opts.device()];
  if (!t.bounds.defined()) {
    const double inf = std::numeric_limits<double>::infinity();
    const double tiny = std::numeric_limits<double>::denorm_min();
    const double most = std::numeric_limits<double>::max();
    // bucketize gives each value the first boundary not below it: -inf 0,
    // negative 1, zero (either sign) 2, positive 3, +inf 4, NaN (below
    // nothing) 5.
    t.bounds = at::tensor(std::vector<double>{-inf, -tiny, 0.0, most, inf}, at::kDouble).to(opts.device());
    // Class -> (finite, NaN, +inf, zero): the first four fields of a row.
    t.counts = at::tensor(std::vector<double>{0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0},
                          at::kDouble)
                   .view({6, 4})
                   .to(opts.device());
  }
  if (!t.starts.defined() || t.starts.numel() < rows) {
    const int64_t n = std::max<int64_t>(rows, kDeviceScratchBytes / 8 / kRowWidth);
    t.starts = at::arange(0, n * kRowWidth, kRowWidth, opts.dtype(at::kInt));
  }
  return t;
}

}  // namespace

// The rows of the staging buffer `x` ([rows, kRowWidth], float64, padded
// with NaN; it is overwritten), [rows, kFields]: finite, NaN and +inf
// counts, zero count, and over the finite values min, max, sum, and their
// sum of squared deviations from their mean divided by kRowWidth. One
// launch per statistic for the whole batch (eleven):
// - the counts: each value's class (bucketize, int32) and one embedding_bag
//   that sums each row's classes as (finite, NaN, +inf, zero), exact in
//   float64. The classes and embedding_bag's own index of bags (4 bytes an
//   element each, on CUDA as on the CPU) are the most alive beside `x`: 16
//   bytes an element in all;
// - non-finite values are then replaced in place by their row's finite
//   mean (a one-byte mask), which leaves the extremes, the mean and the
//   spread of the finite values as they are, so one aminmax and, over the
//   deviations from that mean, one var_mean serve every row.
at::Tensor row_stats(at::Tensor& x, const RowsHook& nan_made) {
  const int64_t rows = x.size(0);
  const auto nan = std::numeric_limits<double>::quiet_NaN();
  const RowTables& tab = row_tables(x.options(), rows);
  at::Tensor counts;
  {
    const at::Tensor cls = at::bucketize(x, tab.bounds, /*out_int32=*/true, /*right=*/false);
    counts = std::get<0>(at::_embedding_bag_forward_only(tab.counts, cls.view({-1}), tab.starts.narrow(0, 0, rows),
                                                         false, /*mode=sum*/ 0));
  }
  x.nan_to_num_(nan, nan, nan);
  if (nan_made) nan_made(x, tab.starts);
  const at::Tensor sum = at::nansum(x, 1);
  // NaN in a row with nothing finite: its extremes and spread are NaN.
  const at::Tensor mean = at::div(sum, counts.select(1, 0)).unsqueeze(1);
  at::where_out(x, at::isnan(x), mean, x);
  auto [lo, hi] = at::aminmax(x, 1, false);
  // The spread from the deviations: var_mean along a dimension updates a
  // running mean (Welford), whose rounding grows with the mean against the
  // spread (2e-12 relative for values 1e6 +- 1).
  x.sub_(mean);
  auto [var, mu] = at::var_mean(x, at::IntArrayRef{1}, std::optional<at::Scalar>(at::Scalar(0)), false);
  return at::cat({counts, lo.unsqueeze(1), hi.unsqueeze(1), sum.unsqueeze(1), var.unsqueeze(1)}, 1);
}

// The counts of a row of row_stats or piece_row (the finite, NaN, +inf
// and zero counts lead both) over its `n` elements, `padding` of them NaN
// added by opdump; -inf is what is left. Returns the finite count.
int64_t row_counts(const double* v, int64_t n, int64_t padding, Acc& a) {
  const auto count = static_cast<int64_t>(v[0]);
  a.nan = static_cast<int64_t>(v[1]) - padding;
  a.posinf = static_cast<int64_t>(v[2]);
  a.neginf = n - padding - count - a.nan - a.posinf;
  a.zero = static_cast<int64_t>(v[3]);
  return count;
}

// The statistics of `valid` elements from their row of row_stats, whose
// other kRowWidth - valid elements were NaN padding.
Acc row_acc(const double* v, int64_t valid) {
  Acc a;
  const int64_t count = row_counts(v, kRowWidth, kRowWidth - valid, a);
  if (count > 0) {
    a.finite = count;
    a.min = v[4];
    a.max = v[5];
    a.sum = v[6];
    a.mean = v[6] / static_cast<double>(count);
    // The replaced elements sit at the mean: kRowWidth times the variance
    // over the whole row is the finite values' sum of squared deviations.
    a.m2 = v[7] * static_cast<double>(kRowWidth);
    a.sumsq = a.m2 + static_cast<double>(count) * a.mean * a.mean;
  }
  return a;
}

// The statistics of one piece from its row.
Acc piece_acc(const double* v, int64_t n) {
  Acc a;
  const int64_t count = row_counts(v, n, 0, a);
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
