// The boxed fallback that sees every op: measures the inputs, redispatches to
// the rest of the dispatcher, measures the outputs, and hands one plain
// record to Rust. Modelled on PyTorch's in-tree boxed fallbacks
// (ConjugateFallback.cpp): the redispatch uses the keys after ours, and
// arguments and returns are read off the stack. The rows of the tensors are
// built by RowBuilder (rows/row_builder.h); memory without values is followed through
// copies by Carries (carries.h).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/SequenceNumber.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include "opdump/cpp/rows/arg_text.h"
#include "opdump/cpp/rows/call_args.h"
#include "opdump/cpp/hook/call_kind.h"
#include "opdump/cpp/hook/carries.h"
#include "opdump/cpp/check/cpu_rerun.h"
#include "opdump/cpp/device/device_stats.h"
#include <optional>

#include "opdump/cpp/check/check.h"
#include "opdump/cpp/common/common.h"
#include "opdump/cpp/common/pointer_table.h"
#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/hook/parts.h"
#include "opdump/cpp/rows/rows.h"
#include "opdump/cpp/stats/stats.h"
#include "opdump/cpp/hook/op_kinds.h"
#include "opdump/cpp/rows/row_builder.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

std::atomic<bool> g_active{false};
std::atomic<bool> g_hook_only{false};

namespace {

// Epoch time of a steady-clock reading: the wall clock is read once, so a
// call reads one clock at its start and one at its end (on a virtual
// machine a clock read can cost as much as a small op's bookkeeping). A
// later step of the wall clock (NTP) does not move the calls' times.
int64_t epoch_ns(std::chrono::steady_clock::time_point t) {
  using std::chrono::nanoseconds;
  static const int64_t offset =
      std::chrono::duration_cast<nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count() -
      std::chrono::duration_cast<nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return offset + std::chrono::duration_cast<nanoseconds>(t.time_since_epoch()).count();
}

std::string error_text(const std::exception& e) {
  if (auto* c10e = dynamic_cast<const c10::Error*>(&e)) return c10e->what_without_backtrace();
  return e.what();
}

// Pairs op_exit with op_enter on every path out of the fallback, the user's
// exceptions included. A call with rows still waiting for device statistics
// leaves through device_call_exited, which hands it over once they arrive.
struct ExitGuard {
  RowBuilder* rec;
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

// A CPU check whose inputs were copied is started, or reported failed on
// the way out when the op raised (Rust counts the checks under way).
struct CpuCheckGuard {
  std::optional<CpuCheckInputs> inputs;
  ~CpuCheckGuard() {
    if (!inputs) return;
    try {
      cpu_check_failed(rust::Str("the op raised an error"));
    } catch (...) {
    }
  }
};

// An accuracy check (OPDUMP_CHECK) whose inputs were copied is queued
// after the op ran, or dropped on the way out when the op raised: its
// signature is then checked at its next call.
struct AccuracyCheckGuard {
  int64_t id = -1;
  std::optional<AccuracyCheckStart> start;
  ~AccuracyCheckGuard() {
    if (id < 0) return;
    try {
      check_dropped(id, false);
    } catch (...) {
    }
  }
};

// OPDUMP_CHECK: whether Rust wants this call checked, and if so its inputs
// copied to the host as they are before it runs.
void start_accuracy_check(AccuracyCheckGuard& check, const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                          const OpCall& call) {
  try {
    const auto& name = op.operator_name();
    const std::string signature = call_signature(op, stack, std::string_view(call.args.data(), call.args.size()));
    const std::string_view overload =
        name.overload_name.empty() ? std::string_view("default") : std::string_view(name.overload_name);
    const int64_t id = check_wanted(rust::Str(name.name), rust::Str(overload.data(), overload.size()),
                                    rust::Str(call.args.data(), call.args.size()), rust::Str(signature),
                                    input_bytes(op, stack));
    if (id < 0) return;
    check.id = id;
    check.start = accuracy_check_start(op, stack);
  } catch (const std::exception& e) {
    warn(rust::Str(std::string("the accuracy check of ") + op.operator_name().name +
                   " could not copy its inputs: " + e.what()));
  }
}

int64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// What the hook needs to know of an op apart from any one call: judged from
// its name and schema at its first call on a thread, so that its other
// calls pay no string work, and a call the regexes do not select asks Rust
// nothing but its place on the stack.
struct OpFacts {
  std::string name, overload;  // to tell a reused entry from the one cached
  std::string shown_overload;  // "default" for ""
  std::string_view base;       // `addmm` of `aten::addmm`, in `name`
  size_t num_args = 0;
  const OpNames* names = nullptr;  // the interned names (op_names)
  bool control = false;      // opdump::, our own control ops
  bool may_carry = false;    // Carries may follow memory without values
  bool empty = false;        // its outputs hold no values (empty*)
  bool collective = false;   // its outputs are written after it returns
  bool write_scope = false;  // it writes memory a WriteScope must note
  bool views_only = false;   // it returns views of its inputs only
  bool preserves_values = false;  // a view with its input's values
  bool preserves_order = false;   // ... in their order (a reshape)
  int8_t selected = -1;      // the regexes' verdict; -1: not had yet
  // Per argument, by schema index: what record_inputs asks of each call.
  enum ArgBits : uint8_t { kWritten = 1, kTensorType = 2, kValuesDefined = 4 };
  c10::SmallVector<uint8_t, 8> args;
  // Per return: whether it aliases an argument, and whether it writes it.
  enum ReturnBits : uint8_t { kAliased = 1, kWrites = 2 };
  c10::SmallVector<uint8_t, 2> returns;
  uint64_t epoch = 0;  // g_op_epoch when the entry was last checked
};

// Bumped whenever the dispatcher drops an operator (OpEpochListener): a
// cached entry checked at the current value is the op it was made for,
// with no look at the schema or the names (a cache miss or two on most
// calls of a large model). Starts above a new entry's 0.
std::atomic<uint64_t> g_op_epoch{1};

// Calls from above autograd note what their kernel may trust and write: a
// top-level call's arguments are known memory (provenance.cpp), and the
// arguments it writes are kept out of the reuse cache inside it (reuse.cpp).
// This runs for unrecorded calls too, so that recorded calls nested in them
// see the right memory.
void note_known_arguments(const OpFacts& facts, const torch::jit::Stack& stack) {
  provenance_begin_top_level();
  for (size_t i = stack.size() - facts.num_args; i < stack.size(); ++i) provenance_note_all(stack[i]);
  provenance_arguments_noted();
}

// A recorded call notes the arguments it writes after its inputs are
// measured: until its kernel runs they hold what the cache says, so an
// in-place op's `self` is taken from the cache like any other input (the
// optimizer's in-place ops read a ninth of a TinyLM step's bytes again
// otherwise).
void note_written_arguments(const OpFacts& facts, const torch::jit::Stack& stack) {
  reuse_begin_call();
  const size_t first = stack.size() - facts.num_args;
  for (size_t i = 0; i < facts.num_args; ++i)
    if (facts.args[i] & OpFacts::kWritten) reuse_note_written(stack[first + i]);
}

// Checks the cached entry `f` of `op` and remakes it where it was made for
// another op at the same address.
void refresh_op_facts(const c10::OperatorHandle& op, OpFacts& f, uint64_t epoch) {
  const auto& name = op.operator_name();
  const auto& schema = op.schema();
  if (f.num_args != schema.arguments().size() || f.name != name.name || f.overload != name.overload_name) {
    f = OpFacts{};
    f.name = name.name;
    f.overload = name.overload_name;
    f.shown_overload = f.overload.empty() ? "default" : f.overload;
    f.num_args = schema.arguments().size();
    f.base = base_name(f.name);
    f.names = &op_names(op);
    f.control = name.name.starts_with("opdump::");
    f.may_carry = may_carry(f.base);
    f.empty = output_uninitialized(f.base);
    f.collective = outputs_asynchronous(name.name);
    f.write_scope = opens_write_scope(schema);
    f.preserves_values = preserves_values(f.base, f.overload);
    f.preserves_order = preserves_order(f.base);
    for (const auto& a : schema.arguments()) {
      const bool writes = is_written(a);
      f.args.push_back(static_cast<uint8_t>((writes ? OpFacts::kWritten : 0) |
                                            (is_tensor_type(a) ? OpFacts::kTensorType : 0) |
                                            (input_values_defined(f.base, a, writes) ? OpFacts::kValuesDefined : 0)));
    }
    for (const auto& r : schema.returns()) {
      const auto* alias = r.alias_info();
      f.returns.push_back(static_cast<uint8_t>((alias != nullptr ? OpFacts::kAliased : 0) |
                                               (alias != nullptr && alias->isWrite() ? OpFacts::kWrites : 0)));
    }
    // A view op computes nothing: there is nothing of the device's to check.
    f.views_only = !f.returns.empty() && std::all_of(f.returns.begin(), f.returns.end(), [](uint8_t r) {
      return r == OpFacts::kAliased;
    });
  }
  f.epoch = epoch;
}

const OpFacts& op_facts(const c10::OperatorHandle& op) {
  // Keyed by the operator's entry, as op_names (interned.cpp): an op
  // deregistered and another registered at the same address is told apart
  // by its name, overload and argument count, checked again after any op
  // was deregistered. Everything here is the same for every call of the
  // op, so its calls pay no string work.
  thread_local PointerTable<OpFacts> cache;
  const auto& name = op.operator_name();
  OpFacts& f = cache[&name];
  const uint64_t epoch = g_op_epoch.load(std::memory_order_acquire);
  if (f.epoch != epoch) refresh_op_facts(op, f, epoch);
  if (f.selected < 0 && !f.control) {
    const int32_t v = op_selected(rust::Str(f.name), rust::Str(f.shown_overload));
    if (v >= 0) f.selected = static_cast<int8_t>(v);
  }
  return f;
}

// The tensors a collective (c10d) takes are what it fills, though its
// schema marks no write: from its return on they hold values, whole, even
// where only a part of them held values before (FSDP's all-gather buffer).
struct CollectiveFills {
  c10::SmallVector<c10::IValue, 4> arguments;
  CollectiveFills(const OpFacts& facts, const torch::jit::Stack& stack) {
    if (!facts.collective || !uninitialized_tracking()) return;
    const size_t n = std::min(facts.num_args, stack.size());
    arguments.assign(stack.end() - static_cast<std::ptrdiff_t>(n), stack.end());
  }
  void done() {
    for (const auto& v : arguments) for_each_tensor(v, [](const at::Tensor& t) { forget_uninitialized(t); });
    arguments.clear();
  }
};

// Arguments written by the call, for ops that return nothing.
using Written = c10::SmallVector<std::pair<size_t, c10::IValue>, 2>;

// A call that is not recorded still produces memory with values, or copies
// memory without.
void run_unrecorded(const c10::OperatorHandle& op, const OpFacts& facts, c10::DispatchKeySet next,
                    torch::jit::Stack* stack, bool versioned) {
  const auto& schema = op.schema();
  Carries carries;
  Written written;
  try {
    if (facts.may_carry) carries = Carries::judge(facts.base, schema, *stack);
    if (facts.returns.empty() && (carries.kind != CarryKind::None || uninitialized_tracking())) {
      const size_t first = stack->size() - facts.num_args;
      for (size_t i = 0; i < facts.num_args; ++i)
        if (facts.args[i] & OpFacts::kWritten) written.emplace_back(i, (*stack)[first + i]);
    }
  } catch (const std::exception& e) {
    carry_failed(op, e);
  }
  CollectiveFills filled(facts, *stack);
  std::optional<WriteScope> writing;
  if (facts.write_scope) writing.emplace(schema, *stack);
  op.redispatchBoxed(next, stack);
  try {
    const size_t n = facts.returns.size();
    const bool empty = facts.empty;
    for (size_t r = 0; r < n; ++r) {
      const c10::IValue& v = (*stack)[stack->size() - n + r];
      const bool aliased = facts.returns[r] & OpFacts::kAliased, writes = facts.returns[r] & OpFacts::kWrites;
      if (!aliased) provenance_note_all(v);
      note_unrecorded_output(v, !aliased || writes, writes, empty, carries, versioned);
    }
    for (const auto& [i, v] : written) note_unrecorded_output(v, true, true, false, carries, versioned);
    filled.done();
  } catch (const std::exception& e) {
    carry_failed(op, e);
  }
}

// Names the call, measures its tensor arguments and writes the others as
// text. A failure here is opdump's, never the job's.
void record_inputs(RowBuilder& rec, const c10::OperatorHandle& op, const OpFacts& facts,
                   const torch::jit::Stack& stack, const OpTicket& ticket, Written& written) {
  const auto& name = op.operator_name();
  try {
    const auto& args = op.schema().arguments();
    rec.call.tensors.reserve(facts.num_args + facts.returns.size());
    const OpNames& names = *facts.names;
    rec.call.op_id = names.op;
    rec.call.overload_id = names.overload_id;
    const size_t first = stack.size() - args.size();
    std::string text;
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& v = stack[first + i];
      const uint8_t bits = facts.args[i];
      if (holds_tensors(v) || (v.isNone() && (bits & OpFacts::kTensorType))) {
        if (bits & OpFacts::kWritten) written.emplace_back(i, v);
        if (ticket.inputs) rec.value(v, Role::Input, names.args[i], (bits & OpFacts::kValuesDefined) != 0);
      } else {
        append_arg_text(text, args[i], v);
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
void run_timed(RowBuilder& rec, const c10::OperatorHandle& op, const OpFacts& facts, c10::DispatchKeySet next,
               torch::jit::Stack* stack) {
  std::optional<WriteScope> writing;
  if (facts.write_scope) writing.emplace(op.schema(), *stack);
  const auto t0 = std::chrono::steady_clock::now();
  rec.call.start_ns = epoch_ns(t0);
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
void record_outputs(RowBuilder& rec, const c10::OperatorHandle& op, const OpFacts& facts,
                    const torch::jit::Stack& stack, const OpTicket& ticket, const Written& written) {
  const auto& name = op.operator_name();
  try {
    if (ticket.shortcuts && facts.preserves_values) {
      static const uint32_t self = name_id("self");
      for (size_t i = 0; i < rec.call.tensors.size(); ++i)
        if (rec.call.tensors[i].role == Role::Input && rec.call.tensors[i].arg_id == self) rec.view_source = i;
      rec.view_keeps_order = facts.preserves_order;
    }
    const bool async_outputs = facts.collective;
    const bool fresh = !facts.empty && !async_outputs;
    const StatsStatus no_values = async_outputs ? StatsStatus::NotMeasured : StatsStatus::Uninitialized;
    if (!facts.returns.empty()) {
      const size_t first = stack.size() - facts.returns.size();
      for (size_t r = 0; r < facts.returns.size(); ++r) {
        // A view of an input holds no new values; anything else the op computed.
        const bool writes = facts.returns[r] & OpFacts::kWrites;
        const bool produced = !(facts.returns[r] & OpFacts::kAliased) || writes;
        rec.alias_return = !produced;
        rec.write_return = writes;
        rec.value(stack[first + r], Role::Output, return_name_id(r), fresh, produced, no_values);
      }
    } else {
      rec.alias_return = false;
      rec.write_return = true;
      for (auto& [i, v] : written) rec.value(v, Role::Output, facts.names->args[i], fresh, true, no_values);
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

// The calls this thread is inside, counted by the hook (Rust's stack holds
// only those it was asked about): each call's depth, on every path out.
thread_local int32_t tl_depth = 0;
struct Deeper {
  Deeper() { ++tl_depth; }
  ~Deeper() { --tl_depth; }
  Deeper(const Deeper&) = delete;
  Deeper& operator=(const Deeper&) = delete;
};

// Pairs op_leave with op_enter for a call that is not recorded, on every
// path out, the user's exceptions included.
struct LeaveGuard {
  ~LeaveGuard() {
    try {
      op_leave();
    } catch (...) {
    }
  }
};

// A call that is not recorded: `entered` when Rust was asked (op_enter),
// which then pairs it with op_leave.
void run_not_recorded(const c10::OperatorHandle& op, const OpFacts& facts, c10::DispatchKeySet next,
                      torch::jit::Stack* stack, const OpTicket& ticket, bool entered) {
  // No RowBuilder: its OpCall's strings and vectors are Rust's, each made
  // and dropped across the bridge.
  std::optional<LeaveGuard> leave;
  if (entered) leave.emplace();
  // OPDUMP_ON_DIVERGENCE=stop raises the job's own error where its op would
  // run; the guard pairs the entry as for any error.
  if (ticket.stop) TORCH_CHECK(false, std::string(stop_message()));
  const bool versioned = from_above_autograd();
  if (ticket.depth == 0) note_known_arguments(facts, *stack);
  if (ticket.depth == 0 || versioned) note_written_arguments(facts, *stack);
  run_unrecorded(op, facts, next, stack, versioned);
}

void record_and_run(const c10::OperatorHandle& op, const OpFacts& facts, c10::DispatchKeySet next,
                    torch::jit::Stack* stack, const OpTicket& ticket) {
  if (!ticket.record) return run_not_recorded(op, facts, next, stack, ticket, true);
  const bool versioned = from_above_autograd();
  const bool above_autograd = ticket.depth == 0 || versioned;
  // Every op_enter is paired with op_exit: the guard comes first.
  RowBuilder rec;
  ExitGuard exit_guard{&rec};
  if (ticket.stop) TORCH_CHECK(false, std::string(stop_message()));
  if (ticket.depth == 0) note_known_arguments(facts, *stack);

  rec.nested = ticket.depth > 0;
  rec.above_autograd = above_autograd;
  rec.versioned = versioned;
  rec.shortcuts = ticket.shortcuts;
  Written written;
  Carries carries;
  if (facts.may_carry) {
    try {
      carries = Carries::judge(facts.base, op.schema(), *stack);
      rec.carries = &carries;
    } catch (const std::exception& e) {
      carry_failed(op, e);
    }
  }
  if (ticket.source) rec.call.source = rust::String(python_source());
  record_inputs(rec, op, facts, *stack, ticket, written);
  if (above_autograd) note_written_arguments(facts, *stack);
  // The autograd nodes the op makes take the next sequence numbers of this
  // thread: the call claims them for its backward calls (fwd_seq).
  CpuCheckGuard cpu_check;
  if (ticket.check_on_cpu) {
    try {
      cpu_check.inputs = cpu_check_inputs(op, *stack);
    } catch (const std::exception& e) {
      cpu_check_failed(rust::Str(std::string("its inputs could not be copied to the host: ") + e.what()));
    }
  }
  AccuracyCheckGuard accuracy;
  if (ticket.check && !facts.views_only) start_accuracy_check(accuracy, op, *stack, rec.call);
  const auto first_node = static_cast<int64_t>(at::sequence_number::peek());
  CollectiveFills filled(facts, *stack);
  run_timed(rec, op, facts, next, stack);
  try {
    filled.done();
  } catch (const std::exception& e) {
    carry_failed(op, e);
  }
  if (accuracy.start) {
    const int64_t id = accuracy.id;
    accuracy.id = -1;
    try {
      accuracy_check_enqueue(id, std::move(*accuracy.start), op, *stack);
    } catch (const std::exception& e) {
      check_dropped(id, false);
      warn(rust::Str(std::string("the accuracy check of ") + op.operator_name().name +
                     " could not copy its outputs: " + e.what()));
    }
  }
  if (cpu_check.inputs) {
    CpuCheckInputs inputs = std::move(*cpu_check.inputs);
    cpu_check.inputs.reset();
    try {
      cpu_check_start(std::move(inputs), op, *stack);
    } catch (const std::exception& e) {
      cpu_check_failed(rust::Str(std::string("its outputs could not be copied to the host: ") + e.what()));
    }
  }
  const auto end_node = static_cast<int64_t>(at::sequence_number::peek());
  if (end_node > first_node)
    op_made_nodes(static_cast<int64_t>(at::RecordFunction::currentThreadId()), first_node, end_node);
  record_outputs(rec, op, facts, *stack, ticket, written);
}

}  // namespace

namespace {

class OpEpochListener final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override { g_op_epoch.fetch_add(1); }
};

}  // namespace

void watch_op_deregistrations() {
  // Kept for the process, as the fallback's registration is (install.cpp).
  static auto* handle =
      new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().addRegistrationListener(
          std::make_unique<OpEpochListener>()));
  (void)handle;
}

void hook_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  // opdump's own CPU reruns (cpu_rerun.cpp) pass here to be stopped
  // before they draw random numbers; nothing of theirs is recorded.
  if (C10_UNLIKELY(rerunning_here())) return rerun_fallback(op, ks, stack);
  const auto next = ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kHookKey);
  if (!g_active.load(std::memory_order_relaxed) || g_hook_only.load(std::memory_order_relaxed)) {
    op.redispatchBoxed(next, stack);
    return;
  }
  const OpFacts& facts = op_facts(op);
  if (facts.control || tracing_call(*stack, facts.num_args)) {
    op.redispatchBoxed(next, stack);
    return;
  }
  python_hooks_tick();
  const int32_t depth = tl_depth;
  Deeper deeper;
  // A call of an op the regexes leave out is never recorded: Rust is not
  // asked about it, except at the top level while it asks for every call
  // there (`selected` -1, not had yet, counts as selected: Rust decides).
  if (facts.selected == 0 && (depth > 0 || !every_top_level_call())) {
    OpTicket ticket{};
    ticket.depth = depth;
    return run_not_recorded(op, facts, next, stack, ticket, false);
  }
  OpTicket ticket;
  if (facts.selected != 0) {
    int64_t node_thread = -1, node_seq_nr = -1;
    current_backward_node(node_thread, node_seq_nr);
    ticket = op_enter(rust::Str(facts.name), rust::Str(facts.shown_overload), true, current_phase(), node_thread,
                      node_seq_nr, depth);
  } else {
    ticket = op_enter(rust::Str(), rust::Str(), false, Phase::Forward, -1, -1, depth);
  }
  record_and_run(op, facts, next, stack, ticket);
}

}  // namespace opdump
