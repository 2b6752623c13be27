// The reductions that measure device tensors (device_reduce.cpp): each gives
// rows of kFields statistics (device_stats.h) on the tensor's device, read
// back on the host by piece_acc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "opdump/cpp/device/device_stats.h"

namespace opdump::devstats {

// One row per piece (kFields, device_stats.h): finite count, NaN count, +inf
// count, zero count, and over the finite values min, max, mean and the sum of
// squared deviations from that mean.
// piece_row keeps at most about 17 bytes per element of a piece alive at
// once (two float64 copies and a one-byte mask); the pieces are sized for 64
// bytes per element, which leaves room for a backend's own temporaries.
constexpr int64_t kPieceElements = kDeviceScratchBytes / 64;

// The pieces of `t`, each of at most kPieceElements elements. A dense
// tensor (any order of dimensions) is read through a flat view of its memory;
// any other is split along its outer dimensions into views, each converted
// on its own by piece_row.
// The pieces are consecutive runs of the tensor's elements in logical order.
template <typename F>
void split(const at::Tensor& t, F&& f, int64_t most = kPieceElements) {
  if (t.numel() <= most || t.dim() == 0) return f(t);
  int64_t d = 0;
  while (t.size(d) == 1) ++d;
  const int64_t inner = t.numel() / t.size(d);
  if (inner <= most) {
    const int64_t step = most / inner;
    for (int64_t i = 0; i < t.size(d); i += step) f(t.narrow(d, i, std::min(step, t.size(d) - i)));
  } else {
    for (int64_t i = 0; i < t.size(d); ++i) split(t.select(d, i), f, most);
  }
}

// The fingerprint and sketch take pieces of at most this many elements: their
// int64 words and hashes cost about 60 bytes an element at once.
constexpr int64_t kSignaturePieceElements = kDeviceScratchBytes / 64 / 4;

template <typename F>
void for_each_piece(const at::Tensor& t, F&& f) {
  if (t.is_non_overlapping_and_dense()) {
    const at::Tensor flat = t.as_strided({t.numel()}, {1}, t.storage_offset());
    for (int64_t i = 0; i < flat.numel(); i += kPieceElements)
      f(flat.narrow(0, i, std::min(kPieceElements, flat.numel() - i)));
  } else {
    split(t, f);
  }
}

// The backend's kernel for opdump::fused_stats for `t`'s device, or nullptr.
const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&)>* fused_kernel(const at::Tensor& t);
// The backend's kernel for opdump::fused_stats_batch for `t`'s device, or
// nullptr.
const c10::TypedOperatorHandle<at::Tensor(at::TensorList, int64_t)>* batch_kernel(const at::Tensor& t);
// The row of one piece in `acc` (float64, or float32 where the device has no
// float64), launched on the current stream.
at::Tensor piece_row(const at::Tensor& piece, at::ScalarType acc);
// `n` NaN values (n < kRowWidth) on `opts`'s device and dtype, to pad a
// staged tensor to whole rows.
at::Tensor row_padding(const at::TensorOptions& opts, int64_t n);
// The rows of the staging buffer `x` ([rows, kRowWidth], padded with NaN),
// launched on the current stream; `x` is overwritten. `nan_made`, when
// given, is called once its non-finite values are NaN and the others as
// they were, with `x` and the int32 start of each row (the sketch's moment).
using RowsHook = std::function<void(const at::Tensor& x, const at::Tensor& starts)>;
at::Tensor row_stats(at::Tensor& x, const RowsHook& nan_made = nullptr);
// The statistics of the first `valid` elements of a row of row_stats.
Acc row_acc(const double* v, int64_t valid);
// The statistics of one piece of `n` elements from its row `v`.
Acc piece_acc(const double* v, int64_t n);

}  // namespace opdump::devstats
