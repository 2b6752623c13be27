// The rows of one recorded call (see row_builder.h).

#include "opdump/cpp/rows/row_builder.h"

#include <exception>
#include <utility>

#include "opdump/cpp/device/device_stats.h"
#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/rows/rows.h"
#include "opdump/cpp/stats/stats.h"

namespace opdump {
namespace {

bool measured(const TensorRow& r) {
  return r.status == StatsStatus::Computed || r.status == StatsStatus::Reused || r.status == StatsStatus::View;
}

// The number of elements `out` covers once its dimensions of stride 0
// (broadcast) are set aside, when its other dimensions cover a run of memory
// exactly, without gaps or overlaps; -1 when they do not.
int64_t unbroadcast_extent(const at::Tensor& out) {
  // The dimensions that are not broadcast, from the innermost out.
  int64_t dims[2][16];
  int n = 0;
  for (int64_t d = 0; d < out.dim(); ++d) {
    if (out.size(d) == 1 || out.stride(d) == 0) continue;
    if (n == 16) return -1;
    dims[0][n] = out.stride(d);
    dims[1][n++] = out.size(d);
  }
  for (int i = 1; i < n; ++i)  // insertion sort by stride: at most 16
    for (int j = i; j > 0 && dims[0][j] < dims[0][j - 1]; --j) {
      std::swap(dims[0][j], dims[0][j - 1]);
      std::swap(dims[1][j], dims[1][j - 1]);
    }
  int64_t covered = 1;
  for (int i = 0; i < n; ++i) {
    if (dims[0][i] != covered) return -1;
    covered *= dims[1][i];
  }
  return covered;
}

}  // namespace

const RowBuilder::Waiting* RowBuilder::waiting_row(size_t row) const {
  for (const auto& w : waiting)
    if (w.row == row) return &w;
  return nullptr;
}

// The row of a measured input whose every element `out` shows the same
// number of times, and that number. `out` must be a view of the input's
// memory (same storage, start, dtype and conj/neg bits, the input without
// gaps or overlaps) whose dimensions, once those of stride 0 (broadcast)
// are set aside, cover that memory exactly. Such a view (as_strided,
// reshape without a copy, resolve_conj of a plain tensor, expand) holds
// the input's values in another order, each repeated `repeat` times.
int64_t RowBuilder::same_elements_source(const at::Tensor& out, int64_t& repeat, bool& same_order) const {
  if (!out.has_storage() || out.numel() == 0) return -1;
  const int64_t covered = unbroadcast_extent(out);
  if (covered < 0) return -1;
  for (const auto& [idx, in] : measured_inputs) {
    if (in.has_storage() && in.storage().unsafeGetStorageImpl() == out.storage().unsafeGetStorageImpl() &&
        in.storage_offset() == out.storage_offset() && in.numel() == covered &&
        in.scalar_type() == out.scalar_type() && in.is_conj() == out.is_conj() &&
        in.is_neg() == out.is_neg() && in.is_non_overlapping_and_dense()) {
      repeat = out.numel() / covered;
      same_order = repeat == 1 && out.is_contiguous() && in.is_contiguous();
      return static_cast<int64_t>(idx);
    }
  }
  return -1;
}

// `arg`: the interned name of the argument, or of the return's index.
void RowBuilder::tensor(const at::Tensor& t, Role role, uint32_t arg, int32_t list_index, bool values_defined,
                      bool produced) {
  if (!t.defined()) return;
  TensorRow row{};
  row.name = tensor_name(t);
  row.role = role;
  row.arg_id = arg;
  row.list_index = list_index;
  StatsStatus no_values = this->no_values;
  if (role == Role::Output && carries != nullptr && add_carried(t, list_index, row)) return;
  if (values_defined) values_defined = values_readable(t, produced, no_values);
  if (values_defined && role == Role::Output && add_view(t, row)) return;
  add_measured(t, role, values_defined, no_values, row);
}

// An output of a copy or restride that holds no values (carries.h): its row
// has the metadata only. False for an output with values.
bool RowBuilder::add_carried(const at::Tensor& t, int32_t list_index, TensorRow& row) {
  const Carry carry = carries->decide(t, list_index, versioned);
  if (carry == Carry::Values) return false;
  provenance_note(t);  // memory this call made or wrote: known, empty or not
  measure(t, false, row, StatsStatus::Uninitialized);  // metadata only
  apply_carry(carry, t);
  call.tensors.push_back(std::move(row));
  return true;
}

// Whether the values of `t`, which the op would have defined, are there to
// read: an output the op computed holds values from now on (and is noted as
// memory with values); other memory may hold none yet, and inside a kernel,
// memory of unknown provenance is not measured (`no_values` says so).
bool RowBuilder::values_readable(const at::Tensor& t, bool produced, StatsStatus& no_values) const {
  if (produced) {
    provenance_note(t);
    return produced_values(t, write_return);
  }
  if (still_uninitialized(t)) return false;
  if (nested && !provenance_known(t)) {
    no_values = StatsStatus::NotMeasured;
    return false;
  }
  return true;
}

// An output that shows the values of a measured input (a value-preserving
// view, or a view over exactly the input's memory) takes that input's
// statistics instead of being read. False when it is no such view.
bool RowBuilder::add_view(const at::Tensor& t, TensorRow& row) {
  int64_t source = view_source, repeat = 1;
  bool same_order = view_keeps_order;
  if (alias_return && source < 0 && shortcuts) {
    try {
      source = same_elements_source(t, repeat, same_order);
    } catch (const std::exception&) {
      source = -1;  // symbolic or unusual tensors: measured below
    }
  }
  if (source < 0) return false;
  const TensorRow& src = call.tensors[source];
  if (!measured(src) || src.numel * repeat != t.numel()) return false;
  measure(t, false, row, StatsStatus::View);  // metadata only
  const bool remember = may_remember_view(t, src);
  const Waiting* src_waits = waiting_row(static_cast<size_t>(source));
  if (row.status == StatsStatus::View && src_waits != nullptr)
    wait_like_source(t, *src_waits, repeat, same_order, remember, row);
  else if (row.status == StatsStatus::View)
    take_source_stats(t, src, repeat, same_order, remember, row);
  call.tensors.push_back(std::move(row));
  return true;
}

// Inside a kernel, a view is remembered only when it views memory that
// existed before the call (its input came from the cache, or is a top-level
// argument) and that the call does not write, so its values cannot change
// without its version moving. A view of the kernel's own fresh memory can
// (addmm writes its result after viewing it).
bool RowBuilder::may_remember_view(const at::Tensor& t, const TensorRow& src) const {
  return shortcuts && (above_autograd || ((src.status == StatsStatus::Reused || provenance_is_argument(t)) &&
                                          !reuse_written_by_current_call(t)));
}

// The source's statistics are still on their way: so are these.
void RowBuilder::wait_like_source(const at::Tensor& t, const Waiting& src_waits, int64_t repeat, bool same_order,
                                bool remember, TensorRow& row) {
  const size_t index = call.tensors.size();
  const int64_t k = src_waits.repeat * repeat;
  const DeviceResultPtr result = src_waits.result;
  // The result's signature is in the order of the tensor it measured: a
  // view takes it only through views that all keep it.
  const bool signature = same_order && src_waits.signature;
  if (device_wait_for(result, Later{&pending, index, nullptr, 1, signature}, StatsStatus::View, k, row))
    waiting.push_back({index, result, k, signature});
  if (remember) reuse_remember(t, row, result, k, signature);
}

void RowBuilder::take_source_stats(const at::Tensor& t, const TensorRow& src, int64_t repeat, bool same_order,
                                 bool remember, TensorRow& row) {
  row.stats = src.stats;
  if (repeat > 1) scale_repeated(row.stats, repeat);
  // The same elements in the same order have the same fingerprint and
  // sketch. A view in another order (a transpose) or a broadcast gets none,
  // as on a device: measuring it would copy it to logical order (a tenth of
  // the TinyLM step went there), its input's row has them, and a compare
  // against a device dump, which has none there, could not use them.
  if (same_order) {
    row.fingerprint = src.fingerprint;
    row.has_fingerprint = src.has_fingerprint;
    row.sketch = src.sketch;
  }
  if (remember) reuse_remember(t, row);
}

// Measures `t`, or takes its statistics from the cache of measured tensors.
void RowBuilder::add_measured(const at::Tensor& t, Role role, bool values_defined, StatsStatus no_values,
                            TensorRow& row) {
  // Only calls from above autograd fill the cache: inside a kernel, the
  // kernel may still write a tensor without moving its version (addmm
  // copies the bias into its result with copy_, then runs the GEMM into
  // it). Calls inside a kernel read the cache, except for the memory that
  // kernel's call writes (reuse.cpp). An output found in the cache with its
  // version unchanged (a composite op returning what a call inside it
  // computed, an op returning its input untouched) is not read again.
  const bool lookup = shortcuts && !(role == Role::Output && write_return) &&
                      (above_autograd || !reuse_written_by_current_call(t));
  Later later{&pending, call.tensors.size()};
  measure(t, values_defined, row, no_values, lookup, shortcuts && above_autograd, &later);
  if (later.result) waiting.push_back({later.row, later.result, later.repeat, later.signature});
  if (role == Role::Output && !values_defined && no_values == StatsStatus::Uninitialized) remember_uninitialized(t);
  if (role == Role::Input && shortcuts && measured(row)) measured_inputs.emplace_back(call.tensors.size(), t);
  call.tensors.push_back(std::move(row));
}

void RowBuilder::value(const c10::IValue& v, Role role, uint32_t arg, bool values_defined, bool produced,
                     StatsStatus no_values) {
  this->no_values = no_values;
  if (v.isTensor()) {
    tensor(v.toTensor(), role, arg, -1, values_defined, produced);
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    for (size_t j = 0; j < list.size(); ++j)
      tensor(list.get(j), role, arg, static_cast<int32_t>(j), values_defined, produced);
  } else if (v.isList()) {
    auto list = v.toListRef();
    for (size_t j = 0; j < list.size(); ++j)
      if (list[j].isTensor())
        tensor(list[j].toTensor(), role, arg, static_cast<int32_t>(j), values_defined, produced);
  }
}

}  // namespace opdump
