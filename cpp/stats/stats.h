// The statistics of a tensor (stats.cpp) and the cache of measured tensors
// (reuse.cpp), for the other folders. A device tensor's statistics are
// launched by the device path (device/device_stats.h); what the files of
// stats/ share only among themselves is in stats/parts.h.
#pragma once

#include <cstdint>

#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>

#include "opdump/cpp/device/device_stats.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

// Keys that must not see the ops opdump itself runs to measure a tensor: its
// own, autograd, autocast, user Python modes and functorch.
c10::DispatchKeySet stats_excluded_keys();

// Tensors whose values opdump cannot or must not read (meta, fake, sparse,
// quantized, nested, functorch wrappers, no storage): metadata only.
bool values_unreadable(const at::Tensor& t);

// Fills the status and statistics fields of `row`.
// `no_values` is the status given when `values_defined` is false.
// `lookup`: take the statistics from the cache of measured tensors when they
// are there; `remember`: put what is measured into it. Device tensors need
// `later`: their row may wait for its statistics, and then `later->result`
// says for what.
void measure(const at::Tensor& t, bool values_defined, TensorRow& row,
             StatsStatus no_values = StatsStatus::Uninitialized,
             bool lookup = false, bool remember = false, Later* later = nullptr);

// OPDUMP_SKETCH, read once: the sketch's length, 0 for neither.
int sketch_size_once();

// The cache of measured tensors (reuse.cpp). An entry holds statistics, or
// the device result they will come from (`pending`), each element repeated
// `repeat` times.
// `pending_signature`: whether `pending` also brings the tensor's fingerprint
// and sketch (not for a view that reorders the elements).
void reuse_remember(const at::Tensor& t, const TensorRow& row, DeviceResultPtr pending = nullptr,
                    int64_t repeat = 1, bool pending_signature = true);
// The written arguments of the innermost call from above autograd (see
// reuse.cpp).
void reuse_begin_call();
void reuse_note_written(const c10::IValue& v);
bool reuse_written_by_current_call(const at::Tensor& t);
void reuse_atfork_prepare();
void reuse_atfork_release();

}  // namespace opdump
