// The boxed fallback that sees every op: measures the inputs, redispatches to
// the rest of the dispatcher, measures the outputs, and hands one plain
// record to Rust. Modelled on PyTorch's in-tree boxed fallbacks
// (ConjugateFallback.cpp): the redispatch uses the keys after ours, and
// arguments and returns are read off the stack.

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <exception>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/SequenceNumber.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include "opdump/cpp/device_stats.h"
#include "opdump/cpp/internal.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

std::atomic<bool> g_active{false};
std::atomic<bool> g_hook_only{false};

namespace {

int64_t epoch_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string_view base_name(std::string_view qualified) {
  auto pos = qualified.find("::");
  return pos == std::string_view::npos ? qualified : qualified.substr(pos + 2);
}

// Ops whose tensor argument is only written: its pre-op memory holds no
// meaningful values (often it is fresh from `empty`).
bool writes_without_reading(std::string_view op) {
  static constexpr std::string_view kOps[] = {
      "fill_",   "zero_",      "normal_",  "uniform_",   "bernoulli_", "random_",
      "exponential_", "geometric_", "cauchy_", "log_normal_", "copy_", "set_",
      "resize_", "resize_as_", "_foreach_zero_", "_foreach_copy_",
  };
  for (auto o : kOps)
    if (o == op) return true;
  return false;
}

// Whether an argument holds values before the op runs. Pre-op values of out=
// arguments and of what fill_, copy_, ... overwrite are not values anyone
// computed (often they are fresh from `empty`).
bool input_values_defined(std::string_view op, const c10::Argument& a, bool writes) {
  if (a.is_out()) return false;
  if (writes && writes_without_reading(op)) return false;
  // The backend copy kernels write `dst` without an alias annotation.
  if ((op == "_copy_from" || op == "_copy_from_and_resize") && a.name() == "dst") return false;
  return true;
}

// Collectives write their outputs after they return (asynchronous work):
// reading them at return would race. Only `wait_tensor` hands back final
// values.
bool outputs_asynchronous(std::string_view qualified) {
  if (qualified.starts_with("c10d::")) return true;
  return qualified.starts_with("_c10d_functional::") && qualified != "_c10d_functional::wait_tensor";
}

// Views that hold exactly the values of their input, in another shape or
// order: their output takes the input's statistics. (`expand` repeats
// elements; `as_strided`, `slice` and `select` may select or overlap; `view`
// to another dtype reinterprets bits: all are measured.)
bool preserves_values(std::string_view op, std::string_view overload) {
  static constexpr std::string_view kOps[] = {
      "view", "_reshape_alias", "_unsafe_view", "transpose", "permute", "t",
      "squeeze", "unsqueeze", "detach", "alias", "numpy_T", "mT", "view_as",
  };
  if (op == "view" && overload == "dtype") return false;
  for (auto o : kOps)
    if (o == op) return true;
  return false;
}

// Of those, the views whose elements in logical (row-major) order are their
// input's: reshapes keep the order, transposes do not. Their output takes
// the input's fingerprint and sketch as well.
bool preserves_order(std::string_view op) {
  static constexpr std::string_view kOps[] = {
      "view", "_reshape_alias", "_unsafe_view", "squeeze", "unsqueeze", "detach", "alias", "view_as",
  };
  for (auto o : kOps)
    if (o == op) return true;
  return false;
}

// Ops whose outputs are memory without values yet. (resize_ and set_ are
// judged by what they had before: see Carries.)
bool output_uninitialized(std::string_view op) {
  return op.starts_with("empty") || op.starts_with("new_empty") || op.starts_with("_empty");
}

// Copies and in-place restrides of memory without values (uninitialized.cpp).
//
// A copy of uninitialized memory holds no values either: `torch.empty(n).to(x)`,
// and the CPU fallback of a backend, which copies every argument to the CPU
// (`_to_cpu`), out= buffers included, and copies the results back. Neither
// does the same memory restrided in place (TensorIterator restrides a fresh
// output with `as_strided_`). What each output becomes is judged from the
// arguments before the op runs: in-place ops move the version counter that
// keys the memory.
enum class CarryKind : uint8_t {
  None,
  Copy,      // a new tensor (or `self` itself) with the values of the source
  CopyInto,  // writes the values of the source into `dst`
  Restride,  // `self` in place, metadata only
  Resize,    // `self` in place, on new memory where it grows
  Set,       // `self` onto the memory of the source
};

// What one output of such an op is.
enum class Carry : uint8_t {
  Values,    // what the op computed: measured as usual
  Row,       // no values, but forgotten rather than remembered: inside a kernel
             // the memory may be filled without the dispatcher, moving no
             // version (the CPU fallback runs its op into the CPU copies of
             // out= buffers), so only this row is known to hold none
  Remember,  // no values, remembered at its version after the op
  Keep,      // no values; the memory stays remembered as it was (inside a
             // kernel an in-place op moves no version)
};

struct CarrySpec {
  CarryKind kind = CarryKind::None;
  const char* src = nullptr;  // the argument whose memory is copied or taken
  const char* dst = nullptr;  // the argument written, for CopyInto
};

CarrySpec carry_spec(std::string_view op) {
  using K = CarryKind;
  if (op == "copy_" || op == "_foreach_copy_") return {K::CopyInto, "src", "self"};
  if (op == "_copy_from" || op == "_copy_from_and_resize") return {K::CopyInto, "self", "dst"};
  if (op == "_to_copy" || op == "clone" || op == "lift_fresh_copy" || op == "to" || op == "contiguous")
    return {K::Copy, "self", nullptr};
  if (op == "_to_cpu") return {K::Copy, "tensors", nullptr};  // pairwise over the list
  if (op == "as_strided_" || op == "squeeze_" || op == "unsqueeze_" || op == "transpose_" || op == "t_" ||
      op == "swapdims_" || op == "swapaxes_" || op == "detach_")
    return {K::Restride, "self", nullptr};
  if (op == "resize_" || op == "resize_as_" || op == "_resize_output_") return {K::Resize, "self", nullptr};
  if (op == "set_") return {K::Set, "source", nullptr};
  return {};
}

bool covers_storage(const at::Tensor& t) {
  return t.has_storage() && t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
         static_cast<size_t>(t.numel()) * t.itemsize() >= t.storage().nbytes();
}

// The state of a copy's or restride's arguments before it runs, per output
// (the element of a list, or 0).
struct Carries {
  CarryKind kind = CarryKind::None;
  struct Before {
    bool src_uninitialized = false;
    bool dst_uninitialized = false;
    size_t nbytes = 0;  // Resize: the storage's size before
  };
  c10::SmallVector<Before, 4> before;

  static Carries judge(std::string_view op, const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
    Carries c;
    const CarrySpec spec = carry_spec(op);
    // Without remembered memory only a resize (or set_ to nothing) can
    // start some.
    if (spec.kind == CarryKind::None || (spec.kind != CarryKind::Resize && spec.kind != CarryKind::Set &&
                                         !uninitialized_tracking()))
      return c;
    const size_t first = stack.size() - schema.arguments().size();
    auto arg = [&](const char* name) -> const c10::IValue* {
      if (name == nullptr) return nullptr;
      auto i = schema.argumentIndexWithName(name);
      return i ? &stack[first + *i] : nullptr;
    };
    const c10::IValue* src = arg(spec.src);
    if (src == nullptr && spec.kind == CarryKind::CopyInto) src = arg("other");  // copy_.Tensor
    bool any = false;
    if (spec.kind == CarryKind::Set) {
      // set_() leaves an empty storage; set_ to a Storage has no version
      // counter of its own to check.
      bool none = false;
      if (src == nullptr || src->isNone())
        none = true;
      else if (src->isTensor())
        none = still_uninitialized(src->toTensor());
      else if (src->isStorage())
        none = storage_uninitialized(src->toStorage().unsafeGetStorageImpl());
      c.before.push_back(Before{none, false, 0});
      any = none;
    } else if (src != nullptr) {
      for_each_tensor(*src, [&](const at::Tensor& t) {
        Before b;
        b.src_uninitialized = still_uninitialized(t);
        if (spec.kind == CarryKind::Resize && t.has_storage()) b.nbytes = t.storage().nbytes();
        any = any || b.src_uninitialized || spec.kind == CarryKind::Resize;
        c.before.push_back(b);
      });
      if (const c10::IValue* dst = arg(spec.dst); dst != nullptr && spec.kind == CarryKind::CopyInto) {
        size_t j = 0;
        for_each_tensor(*dst, [&](const at::Tensor& t) {
          if (j < c.before.size()) c.before[j].dst_uninitialized = still_uninitialized(t);
          ++j;
        });
      }
    }
    if (any) c.kind = spec.kind;
    return c;
  }

  // `out`: the output after the op (element `list_index` of a list, or -1);
  // `versioned`: see Recorder::versioned.
  Carry decide(const at::Tensor& out, int32_t list_index, bool versioned) const {
    const size_t i = list_index < 0 ? 0 : static_cast<size_t>(list_index);
    if (kind == CarryKind::None || i >= before.size() || !out.defined()) return Carry::Values;
    const Before& b = before[i];
    try {
      switch (kind) {
        case CarryKind::Copy:
          return b.src_uninitialized ? (versioned ? Carry::Remember : Carry::Row) : Carry::Values;
        case CarryKind::CopyInto:
          // Into a part of memory that holds values elsewhere: only this row.
          if (!b.src_uninitialized) return Carry::Values;
          return versioned && (b.dst_uninitialized || covers_storage(out)) ? Carry::Remember : Carry::Row;
        case CarryKind::Restride:
        case CarryKind::Set:
          return b.src_uninitialized ? (versioned ? Carry::Remember : Carry::Keep) : Carry::Values;
        case CarryKind::Resize:
          if (b.src_uninitialized) return versioned ? Carry::Remember : Carry::Keep;
          // All new memory. Inside a kernel that is the kernel's out= buffer
          // (resize_output), which it fills next without the dispatcher.
          if (b.nbytes == 0) return versioned ? Carry::Remember : Carry::Row;
          // Values followed by new memory: neither is true of the whole.
          return out.has_storage() && out.storage().nbytes() > b.nbytes ? Carry::Row : Carry::Values;
        case CarryKind::None:
          break;
      }
    } catch (const std::exception&) {
      // Symbolic or unusual tensors: never remembered on a guess.
      return b.src_uninitialized ? Carry::Row : Carry::Values;
    }
    return Carry::Values;
  }
};

void carry_failed(const c10::OperatorHandle& op, const std::exception& e) {
  internal_error(rust::Str(std::string("following the memory of ") + op.operator_name().name + " failed: " + e.what()));
}

void apply_carry(Carry c, const at::Tensor& t) {
  if (c == Carry::Remember)
    remember_uninitialized(t);
  else if (c == Carry::Row)
    forget_uninitialized(t);
}

// Doubles as Python prints them: the shortest text that reads back the same.
void append_double(std::string& out, double d) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string_view text(buf, ec == std::errc() ? end - buf : 0);
  out += text;
  if (std::isfinite(d) && text.find_first_of(".e") == std::string_view::npos) out += ".0";
}

// Text of values whose printing through an ostream is the slow path; the
// output is the same as `operator<<` gives.
bool append_plain(std::string& out, const c10::IValue& v) {
  char buf[24];
  if (v.isInt()) {
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v.toInt());
    out.append(buf, ec == std::errc() ? end - buf : 0);
  } else if (v.isBool()) {
    out += v.toBool() ? "True" : "False";
  } else if (v.isNone()) {
    out += "None";
  } else if (v.isDouble()) {
    append_double(out, v.toDouble());
  } else if (v.isIntList()) {
    out += '[';
    bool first = true;
    for (int64_t x : v.toIntList()) {
      if (!first) out += ", ";
      first = false;
      auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
      out.append(buf, ec == std::errc() ? end - buf : 0);
    }
    out += ']';
  } else {
    return false;
  }
  return true;
}

void append_arg_text(std::string& out, const c10::Argument& arg, const c10::IValue& v) {
  if (!out.empty()) out += ", ";
  out += arg.name();
  out += '=';
  auto type = arg.real_type();
  if (type->kind() == c10::TypeKind::OptionalType)
    type = type->expectRef<c10::OptionalType>().getElementType();
  if (v.isInt() && type->kind() == c10::TypeKind::ScalarTypeType) {
    out += c10::getDtypeNames(static_cast<c10::ScalarType>(v.toInt())).first;
    return;
  }
  if (v.isGenerator()) {
    out += "<generator>";
    return;
  }
  const bool enum_int = v.isInt() && (type->kind() == c10::TypeKind::MemoryFormatType ||
                                      type->kind() == c10::TypeKind::LayoutType);
  if (!enum_int && append_plain(out, v)) return;
  // Everything else through one stream per thread: constructing an
  // ostringstream per value costs more than the rest of the record.
  thread_local std::ostringstream s;
  s.str(std::string());
  s.clear();
  if (v.isInt() && type->kind() == c10::TypeKind::MemoryFormatType)
    s << static_cast<c10::MemoryFormat>(v.toInt());
  else if (v.isInt() && type->kind() == c10::TypeKind::LayoutType)
    s << static_cast<c10::Layout>(v.toInt());
  else
    s << v;
  out += s.view();
}

// Builds the rows of one call. Failures to measure one tensor never stop the
// others, and never reach the job.
struct Recorder {
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

  // `nested`: the call runs inside another recorded call. `produced`: an
  // output the op computed (not a view of an input), whose memory holds
  // values from now on.
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

  const Waiting* waiting_row(size_t row) const {
    for (const auto& w : waiting)
      if (w.row == row) return &w;
    return nullptr;
  }

  static bool measured(const TensorRow& r) {
    return r.status == StatsStatus::Computed || r.status == StatsStatus::Reused || r.status == StatsStatus::View;
  }

  // The row of a measured input whose every element `out` shows the same
  // number of times, and that number. `out` must be a view of the input's
  // memory (same storage, start, dtype and conj/neg bits, the input without
  // gaps or overlaps) whose dimensions, once those of stride 0 (broadcast)
  // are set aside, cover that memory exactly. Such a view (as_strided,
  // reshape without a copy, resolve_conj of a plain tensor, expand) holds
  // the input's values in another order, each repeated `repeat` times.
  int64_t same_elements_source(const at::Tensor& out, int64_t& repeat, bool& same_order) const {
    if (!out.has_storage() || out.numel() == 0) return -1;
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
  void tensor(const at::Tensor& t, Role role, uint32_t arg, int32_t list_index, bool values_defined,
              bool produced) {
    if (!t.defined()) return;
    TensorRow row{};
    row.name = tensor_name(t);
    row.role = role;
    row.arg_id = arg;
    row.list_index = list_index;
    StatsStatus no_values = this->no_values;
    if (role == Role::Output && carries != nullptr) {
      const Carry carry = carries->decide(t, list_index, versioned);
      if (carry != Carry::Values) {
        provenance_note(t);  // memory this call made or wrote: known, empty or not
        measure(t, false, row, StatsStatus::Uninitialized);  // metadata only
        apply_carry(carry, t);
        call.tensors.push_back(std::move(row));
        return;
      }
    }
    if (values_defined) {
      if (produced) {
        provenance_note(t);
        forget_uninitialized(t);
      } else if (still_uninitialized(t)) {
        values_defined = false;
      } else if (nested && !provenance_known(t)) {
        values_defined = false;
        no_values = StatsStatus::NotMeasured;
      }
    }
    int64_t source = view_source, repeat = 1;
    bool same_order = view_keeps_order;
    if (values_defined && role == Role::Output && alias_return && source < 0 && shortcuts) {
      try {
        source = same_elements_source(t, repeat, same_order);
      } catch (const std::exception&) {
        source = -1;  // symbolic or unusual tensors: measured below
      }
    }
    if (values_defined && role == Role::Output && source >= 0) {
      const TensorRow& src = call.tensors[source];
      if (measured(src) && src.numel * repeat == t.numel()) {
        measure(t, false, row, StatsStatus::View);  // metadata only
        // Inside a kernel, a view is remembered only when it views memory
        // that existed before the call (its input came from the cache, or
        // is a top-level argument) and that the call does not write, so its
        // values cannot change without its version moving. A view of the
        // kernel's own fresh memory can (addmm writes its result after
        // viewing it).
        const bool remember =
            shortcuts && (above_autograd || ((src.status == StatsStatus::Reused || provenance_is_argument(t)) &&
                                             !reuse_written_by_current_call(t)));
        const Waiting* src_waits = waiting_row(static_cast<size_t>(source));
        if (row.status == StatsStatus::View && src_waits != nullptr) {
          // The source's statistics are still on their way: so are these.
          const size_t index = call.tensors.size();
          const int64_t k = src_waits->repeat * repeat;
          const DeviceResultPtr result = src_waits->result;
          // The result's signature is in the order of the tensor it
          // measured: a view takes it only through views that all keep it.
          const bool signature = same_order && src_waits->signature;
          if (device_wait_for(result, Later{&pending, index, nullptr, 1, signature}, StatsStatus::View, k, row))
            waiting.push_back({index, result, k, signature});
          if (remember) reuse_remember(t, row, result, k, signature);
        } else if (row.status == StatsStatus::View) {
          row.stats = src.stats;
          if (repeat > 1) scale_repeated(row.stats, repeat);
          // The same elements in the same order have the same fingerprint
          // and sketch. A view in another order (a transpose) or a broadcast
          // gets none, as on a device: measuring it would copy it to logical
          // order (a tenth of the TinyLM step went there), its input's row
          // has them, and a compare against a device dump, which has none
          // there, could not use them.
          if (same_order) {
            row.fingerprint = src.fingerprint;
            row.has_fingerprint = src.has_fingerprint;
            row.sketch = src.sketch;
          }
          if (remember) reuse_remember(t, row);
        }
        call.tensors.push_back(std::move(row));
        return;
      }
    }
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

  // One argument or return value: a Tensor, an element of Tensor[] or
  // Tensor?[], or nothing at all.
  // `no_values`: the status when `values_defined` is false.
  void value(const c10::IValue& v, Role role, uint32_t arg, bool values_defined,
             bool produced = false, StatsStatus no_values = StatsStatus::Uninitialized) {
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
};

// Whether this call goes through autograd and ADInplaceOrView, as the
// user's own calls do. Kernels below autograd run with both keys excluded
// (VariableType's AutoDispatchBelowADInplaceOrView), so a nested call that
// still has them comes from a composite op (linear, matmul, reshape), whose
// code only calls ops: every write it makes is dispatched and moves the
// version. Under inference_mode the keys are excluded everywhere and this is
// false below the top level.
bool from_above_autograd() {
  const auto excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
  return !excluded.has(c10::DispatchKey::ADInplaceOrView) && !excluded.has(c10::DispatchKey::AutogradCPU);
}

bool holds_tensors(const c10::IValue& v) {
  if (v.isTensor() || v.isTensorList()) return true;
  if (v.isList()) {
    for (const auto& e : v.toListRef())
      if (e.isTensor()) return true;
  }
  return false;
}

bool is_tensor_type(const c10::Argument& a) {
  auto kind = a.real_type()->kind();
  if (kind == c10::TypeKind::TensorType) return true;
  if (kind == c10::TypeKind::OptionalType)
    return a.real_type()->expectRef<c10::OptionalType>().getElementType()->kind() ==
           c10::TypeKind::TensorType;
  if (kind == c10::TypeKind::ListType) {
    auto el = a.real_type()->expectRef<c10::ListType>().getElementType();
    if (el->kind() == c10::TypeKind::OptionalType)
      el = el->expectRef<c10::OptionalType>().getElementType();
    return el->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

std::string error_text(const std::exception& e) {
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

// Pairs op_exit with op_enter on every path out of the fallback, the user's
// exceptions included. A call with rows still waiting for device statistics
// leaves through device_call_exited, which hands it over once they arrive.
struct ExitGuard {
  Recorder* rec;
  ~ExitGuard() {
    try {
      if (rec->pending)
        device_call_exited(std::move(rec->pending), std::move(rec->call));
      else
        op_exit(rec->call);
    } catch (...) {
    }
  }
};

bool is_written(const c10::Argument& a) { return a.alias_info() != nullptr && a.alias_info()->isWrite(); }

int64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// Calls from above autograd note what their kernel may trust and write: a
// top-level call's arguments are known memory (provenance.cpp), and the
// arguments it writes are kept out of the reuse cache inside it (reuse.cpp).
// This runs for unrecorded calls too, so that recorded calls nested in them
// see the right memory.
void note_call_from_above_autograd(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, bool top_level) {
  if (top_level) provenance_begin_top_level();
  reuse_begin_call();
  const auto& args = schema.arguments();
  const size_t first = stack.size() - args.size();
  for (size_t i = 0; i < args.size(); ++i) {
    if (top_level) provenance_note_all(stack[first + i]);
    if (is_written(args[i])) reuse_note_written(stack[first + i]);
  }
  if (top_level) provenance_arguments_noted();
}

// Arguments written by the call, for ops that return nothing.
using Written = c10::SmallVector<std::pair<size_t, c10::IValue>, 2>;

// What an unrecorded call did to memory without values: the same as a
// recorded one, so that what is recorded later does not depend on the
// selection (OPDUMP_INCLUDE, OPDUMP_MAX_DEPTH, steps). `empty`: the output
// is memory without values (`empty*`).
void note_unrecorded_output(const c10::IValue& v, bool produced, bool empty, const Carries& carries,
                            bool versioned) {
  int32_t j = v.isTensor() ? -1 : 0;
  for_each_tensor(v, [&](const at::Tensor& t) {
    const Carry carry = empty ? Carry::Remember : carries.decide(t, j, versioned);
    if (carry != Carry::Values)
      apply_carry(carry, t);
    else if (produced)
      forget_uninitialized(t);
    ++j;
  });
}

// A call that is not recorded still produces memory with values, or copies
// memory without.
void run_unrecorded(const c10::OperatorHandle& op, c10::DispatchKeySet next, torch::jit::Stack* stack,
                    bool versioned) {
  const auto& schema = op.schema();
  const std::string_view base = base_name(op.operator_name().name);
  Carries carries;
  Written written;
  try {
    carries = Carries::judge(base, schema, *stack);
    if (schema.returns().empty() && (carries.kind != CarryKind::None || uninitialized_tracking())) {
      const auto& args = schema.arguments();
      const size_t first = stack->size() - args.size();
      for (size_t i = 0; i < args.size(); ++i)
        if (is_written(args[i])) written.emplace_back(i, (*stack)[first + i]);
    }
  } catch (const std::exception& e) {
    carry_failed(op, e);
  }
  op.redispatchBoxed(next, stack);
  try {
    const auto& returns = schema.returns();
    const bool empty = output_uninitialized(base);
    for (size_t r = 0; r < returns.size(); ++r) {
      const c10::IValue& v = (*stack)[stack->size() - returns.size() + r];
      const auto* alias = returns[r].alias_info();
      if (alias == nullptr) provenance_note_all(v);
      note_unrecorded_output(v, alias == nullptr || alias->isWrite(), empty, carries, versioned);
    }
    for (const auto& [i, v] : written) note_unrecorded_output(v, true, false, carries, versioned);
  } catch (const std::exception& e) {
    carry_failed(op, e);
  }
}

// Names the call, measures its tensor arguments and writes the others as
// text. A failure here is opdump's, never the job's.
void record_inputs(Recorder& rec, const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                   const OpTicket& ticket, Written& written) {
  const auto& name = op.operator_name();
  try {
    const auto& args = op.schema().arguments();
    const std::string_view base = base_name(name.name);
    rec.call.tensors.reserve(args.size() + op.schema().returns().size());
    const OpNames& names = op_names(op);
    rec.call.op_id = names.op;
    rec.call.overload_id = names.overload_id;
    const size_t first = stack.size() - args.size();
    std::string text;
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& v = stack[first + i];
      const auto& a = args[i];
      const bool writes = is_written(a);
      if (holds_tensors(v) || (v.isNone() && is_tensor_type(a))) {
        if (writes) written.emplace_back(i, v);
        if (ticket.inputs) rec.value(v, Role::Input, names.args[i], input_values_defined(base, a, writes));
      } else {
        append_arg_text(text, a, v);
      }
    }
    rec.call.args = rust::String(text);
  } catch (const std::exception& e) {
    internal_error(rust::Str(std::string("measuring the inputs of ") + name.name + " failed: " + e.what()));
  }
  if (ticket.capture) {
    try {
      save_inputs(rec.call, op.schema(), stack);
    } catch (const std::exception& e) {
      rec.call.captured = false;
      rec.call.saved.clear();
      warn(rust::Str(std::string("capturing the inputs of ") + name.name + " failed: " + e.what()));
    }
  }
}

// Runs the op with its wall time. The user's own error goes back to them
// unchanged, after its message is put into the record.
void run_timed(Recorder& rec, const c10::OperatorHandle& op, c10::DispatchKeySet next, torch::jit::Stack* stack) {
  rec.call.start_ns = epoch_ns();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    op.redispatchBoxed(next, stack);
  } catch (const std::exception& e) {
    rec.call.duration_ns = nanoseconds_since(t0);
    rec.call.has_error = true;
    try {
      rec.call.error = rust::String(error_text(e));
    } catch (...) {
    }
    throw;  // ExitGuard hands over the record
  }
  rec.call.duration_ns = nanoseconds_since(t0);
}

// Measures the returns, or, for in-place ops that return nothing
// (_foreach_add_), the arguments the schema marks as written.
void record_outputs(Recorder& rec, const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                    const OpTicket& ticket, const Written& written) {
  const auto& name = op.operator_name();
  try {
    const std::string_view base = base_name(name.name);
    const auto& returns = op.schema().returns();
    if (ticket.shortcuts && preserves_values(base, name.overload_name)) {
      static const uint32_t self = name_id("self");
      for (size_t i = 0; i < rec.call.tensors.size(); ++i)
        if (rec.call.tensors[i].role == Role::Input && rec.call.tensors[i].arg_id == self) rec.view_source = i;
      rec.view_keeps_order = preserves_order(base);
    }
    const bool async_outputs = outputs_asynchronous(name.name);
    const bool fresh = !output_uninitialized(base) && !async_outputs;
    const StatsStatus no_values = async_outputs ? StatsStatus::NotMeasured : StatsStatus::Uninitialized;
    if (!returns.empty()) {
      const size_t first = stack.size() - returns.size();
      for (size_t r = 0; r < returns.size(); ++r) {
        // A view of an input holds no new values; anything else the op computed.
        const auto* alias = returns[r].alias_info();
        const bool produced = alias == nullptr || alias->isWrite();
        rec.alias_return = !produced;
        rec.write_return = alias != nullptr && alias->isWrite();
        rec.value(stack[first + r], Role::Output, return_name_id(r), fresh, produced, no_values);
      }
    } else {
      rec.alias_return = false;
      rec.write_return = true;
      const OpNames& names = op_names(op);
      for (auto& [i, v] : written) rec.value(v, Role::Output, names.args[i], fresh, true, no_values);
    }
  } catch (const std::exception& e) {
    internal_error(rust::Str(std::string("measuring the outputs of ") + name.name + " failed: " + e.what()));
  }
  if (ticket.capture && rec.call.captured) {
    try {
      std::vector<std::pair<std::string, c10::IValue>> by_name;
      for (const auto& [i, v] : written) by_name.emplace_back(op.schema().arguments()[i].name(), v);
      save_outputs(rec.call, op.schema(), stack, by_name);
    } catch (const std::exception& e) {
      rec.call.capture_outputs_skipped = true;
      warn(rust::Str(std::string("capturing the outputs of ") + name.name + " failed: " + e.what()));
    }
  }
}

void record_and_run(const c10::OperatorHandle& op, c10::DispatchKeySet next, torch::jit::Stack* stack,
                    const OpTicket& ticket) {
  // Every op_enter is paired with op_exit, for unrecorded calls too: the
  // guard comes first.
  Recorder rec;
  ExitGuard exit_guard{&rec};
  const bool versioned = from_above_autograd();
  const bool above_autograd = ticket.depth == 0 || versioned;
  if (above_autograd) note_call_from_above_autograd(op.schema(), *stack, ticket.depth == 0);
  if (!ticket.record) return run_unrecorded(op, next, stack, versioned);

  rec.nested = ticket.depth > 0;
  rec.above_autograd = above_autograd;
  rec.versioned = versioned;
  rec.shortcuts = ticket.shortcuts;
  Written written;
  Carries carries;
  try {
    carries = Carries::judge(base_name(op.operator_name().name), op.schema(), *stack);
    rec.carries = &carries;
  } catch (const std::exception& e) {
    carry_failed(op, e);
  }
  if (ticket.source) rec.call.source = rust::String(python_source());
  record_inputs(rec, op, *stack, ticket, written);
  // The autograd nodes the op makes take the next sequence numbers of this
  // thread: the call claims them for its backward calls (fwd_seq).
  const auto first_node = static_cast<int64_t>(at::sequence_number::peek());
  run_timed(rec, op, next, stack);
  const auto end_node = static_cast<int64_t>(at::sequence_number::peek());
  if (end_node > first_node)
    op_made_nodes(static_cast<int64_t>(at::RecordFunction::currentThreadId()), first_node, end_node);
  record_outputs(rec, op, *stack, ticket, written);
}

// A FakeTensor: a tensor subclass (Python key) over memory on the meta
// device.
bool is_fake(const at::Tensor& t) {
  const auto* impl = t.unsafeGetTensorImpl();
  return impl->key_set().has(c10::DispatchKey::Python) && impl->unsafe_storage() &&
         impl->unsafe_storage().device_type() == c10::DeviceType::Meta;
}

// Calls that torch.compile (Dynamo, AOTAutograd), torch.export or make_fx
// make while tracing: on fake tensors, under a fake or proxy mode. They
// compute nothing of the job's, and their number depends on the compiler,
// so they are not the job's op calls: not recorded, not counted by
// selectors. (The compiled code's own calls, at run time, are.)
bool tracing_call(const torch::jit::Stack& stack, size_t num_args) {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  if (TorchDispatchModeTLS::any_modes_set() &&
      (TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE) ||
       TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY)))
    return true;
  bool fake = false;
  for (size_t i = stack.size() - num_args; i < stack.size() && !fake; ++i)
    for_each_tensor(stack[i], [&](const at::Tensor& t) { fake = fake || is_fake(t); });
  return fake;
}

}  // namespace

void hook_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto next = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kHookKey);
  if (!g_active.load(std::memory_order_relaxed) || g_hook_only.load(std::memory_order_relaxed)) {
    op.redispatchBoxed(next, stack);
    return;
  }
  const auto& name = op.operator_name().name;
  if (name.starts_with("opdump::")) {  // our own control ops
    op.redispatchBoxed(next, stack);
    return;
  }
  if (tracing_call(*stack, op.schema().arguments().size())) {
    op.redispatchBoxed(next, stack);
    return;
  }
  python_hooks_tick();
  const auto& overload = op.operator_name().overload_name;
  int64_t node_thread = -1, node_seq_nr = -1;
  current_backward_node(node_thread, node_seq_nr);
  OpTicket ticket = op_enter(rust::Str(name), rust::Str(overload.empty() ? "default" : overload),
                             current_phase(), node_thread, node_seq_nr);
  record_and_run(op, next, stack, ticket);
}

}  // namespace opdump
