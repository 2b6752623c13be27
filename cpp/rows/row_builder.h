// The rows of one recorded call (row_builder.cpp): each tensor argument and
// return measured, taken from the cache of measured tensors or from the input
// a view shows, or marked as holding no values.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include "opdump/cpp/hook/carries.h"
#include "opdump/cpp/device/device_stats.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

// Builds the rows of one call. Failures to measure one tensor never stop the
// others, and never reach the job.
struct RowBuilder {
  OpCall call;
  // Made at the first row that waits for device statistics: the call then
  // goes to Rust when the last of them arrives (device_stats.h).
  std::shared_ptr<PendingCall> pending;
  // The rows that wait, with what they wait for (for views of them).
  struct Waiting {
    size_t row;
    DeviceResultPtr result;
    int64_t repeat;
    bool signature;  // the row takes the result's fingerprint and sketch
  };
  c10::SmallVector<Waiting, 4> waiting;

  // The call runs inside another recorded call.
  bool nested = false;
  // The call is made from code above autograd: the user's program, or a
  // composite op that only calls other ops (see from_above_autograd). Its
  // tensors go into the cache of measured tensors.
  bool above_autograd = true;
  StatsStatus no_values = StatsStatus::Uninitialized;
  // Reuse and view shortcuts (OPDUMP_REUSE).
  bool shortcuts = true;
  // For a value-preserving view: the row of its `self` input, whose
  // statistics its output takes.
  int64_t view_source = -1;
  // Whether that view keeps the logical order of the elements (a reshape,
  // not a transpose): then it takes the fingerprint and sketch too.
  bool view_keeps_order = false;
  // Whether the return being read is a view of an input (the schema's
  // alias annotation, not written).
  bool alias_return = false;
  // Whether it is an argument the op wrote (in place, out=): always measured,
  // since a custom op without an ADInplaceOrView kernel writes without
  // moving the version.
  bool write_return = false;
  // The measured inputs with their rows, for outputs that are views over
  // exactly the same memory (same_elements).
  c10::SmallVector<std::pair<size_t, at::Tensor>, 4> measured_inputs;
  // For copies and restrides: which outputs hold no values.
  const Carries* carries = nullptr;
  // Writes to memory at this call's level are dispatched and move version
  // counters: the job's own code, and composite ops above autograd. Not so
  // inside kernels, nor in C++ code that calls ops below autograd at the top
  // level: torch.tensor(data) and torch.as_tensor store the data into
  // `empty` memory directly, then pass it through `to`. A copy or restride of
  // memory without values is remembered only where later writes are seen.
  bool versioned = true;

  // One argument or return value: a Tensor, an element of Tensor[] or
  // Tensor?[], or nothing at all.
  // `produced`: an output the op computed (not a view of an input), whose
  // memory holds values from now on.
  // `no_values`: the status when `values_defined` is false.
  void value(const c10::IValue& v, Role role, uint32_t arg, bool values_defined, bool produced = false,
             StatsStatus no_values = StatsStatus::Uninitialized);

 private:
  const Waiting* waiting_row(size_t row) const;
  int64_t same_elements_source(const at::Tensor& out, int64_t& repeat, bool& same_order) const;
  void tensor(const at::Tensor& t, Role role, uint32_t arg, int32_t list_index, bool values_defined,
              bool produced);
  bool add_carried(const at::Tensor& t, int32_t list_index, TensorRow& row);
  bool values_readable(const at::Tensor& t, bool produced, StatsStatus& no_values) const;
  bool add_view(const at::Tensor& t, TensorRow& row);
  bool may_remember_view(const at::Tensor& t, const TensorRow& src) const;
  void wait_like_source(const at::Tensor& t, const Waiting& src_waits, int64_t repeat, bool same_order,
                        bool remember, TensorRow& row);
  void take_source_stats(const at::Tensor& t, const TensorRow& src, int64_t repeat, bool same_order,
                         bool remember, TensorRow& row);
  void add_measured(const at::Tensor& t, Role role, bool values_defined, StatsStatus no_values, TensorRow& row);
};

}  // namespace opdump
