// The accuracy check (OPDUMP_CHECK): a call Rust chose (check_wanted) runs
// again on the CPU from host copies of its inputs as they were before it
// ran, in float64 (the reference) and in its own dtypes, and its outputs on
// the device are measured against both (check_measured). A call that failed
// is saved as a capture file from the same host copies (check_captured).
// An op that returns no tensor (`_foreach_add_`, `_fused_adamw_`) has the
// arguments it writes as its outputs; tensor-list outputs are measured per
// list index (CheckElement), for Rust to judge and name each.
//
// The job's thread only copies: the inputs before the op runs
// (cpu_check_inputs) and the outputs after (accuracy_check_enqueue). The
// CPU runs happen on one thread of opdump's own, fed by a queue whose bytes
// Rust bounds; its calls skip opdump's key and autograd.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <sstream>

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/check/cpu_rerun.h"
#include "opdump/cpp/check/check.h"
#include "opdump/cpp/common/common.h"
#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/rows/rows.h"
#include "opdump/cpp/stats/stats.h"

namespace opdump {

namespace {

struct Job {
  int64_t id;
  RerunOp op;  // found again when it runs: see cpu_rerun.h
  torch::jit::Stack inputs64, inputs;  // the arguments, host copies
  std::vector<size_t> written;         // the indices of the arguments it writes
  // It returns no tensor: the arguments it writes are its outputs.
  bool outputs_written = false;
  torch::jit::Stack outputs;       // host copies: the returns, or the written arguments
  std::vector<std::string> names;  // per list element (AccuracyCheckStart)
  std::string device, dtype;
};

struct Queue {
  std::mutex m;
  std::condition_variable cv;
  std::deque<Job> jobs;
  bool abandoned = false;
  bool started = false;
};

// Never destroyed: the thread may still wait on it while the process exits.
Queue& queue() {
  static auto* q = new Queue();
  return *q;
}

// The larger of two errors, NaN (a value the reference has not) winning.
double worse(double a, double b) { return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b); }

// Host copies whose tensors are cloned, for a run that writes into them.
torch::jit::Stack cloned(const torch::jit::Stack& stack) {
  torch::jit::Stack out;
  for (const auto& v : stack) out.push_back(on_host(v, false));
  return out;
}

// The first sentence of an error, which names what failed; torch's
// "Could not run" errors go on to list every backend.
std::string first_line(const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  std::string what = c10e != nullptr ? c10e->what_without_backtrace() : e.what();
  what = what.substr(0, what.find('\n'));
  const size_t stop = what.find(". ");
  if (stop != std::string::npos) what = what.substr(0, stop);
  return what.size() > 200 ? what.substr(0, 200) + "..." : what;
}

bool is_tensor_list(const c10::IValue& v) {
  return v.isTensorList() || (v.isList() && v.toListRef().size() > 0 && v.toListRef()[0].isTensor());
}

size_t list_size(const c10::IValue& v) { return v.isTensorList() ? v.toTensorList().size() : v.toListRef().size(); }

// Element i of a tensor list (undefined for a None of a Tensor?[]).
at::Tensor list_at(const c10::IValue& v, size_t i) {
  if (v.isTensorList()) return v.toTensorList().get(i);
  const c10::IValue& e = v.toListRef()[i];
  return e.isTensor() ? e.toTensor() : at::Tensor();
}

// The values a run of the op leaves: its last `returns` stack values, or
// the arguments it wrote (taken from its arguments before it ran).
std::vector<c10::IValue> last_values(const torch::jit::Stack& stack, size_t returns) {
  return {stack.end() - static_cast<std::ptrdiff_t>(std::min(returns, stack.size())), stack.end()};
}
std::vector<c10::IValue> picked(const torch::jit::Stack& args, const std::vector<size_t>& indices) {
  std::vector<c10::IValue> out;
  for (const size_t i : indices)
    if (i < args.size()) out.push_back(args[i]);
  return out;
}

// Errors of one set of outputs, worst over them.
struct Errors {
  bool any = false;
  bool informative = false;  // some reference value is not zero
  double device_err = -1, cpu_err = -1, device_vs_cpu = -1, device_ulp = -1, cpu_ulp = -1;
  int64_t out_numel = 0;

  void add(const at::Tensor& d, const at::Tensor& ref, const at::Tensor& cpu) {
    if (!is_float(d) || !is_float(ref) || !cpu.defined() || d.sizes() != ref.sizes() || cpu.sizes() != ref.sizes())
      return;
    if (!any) {
      device_err = cpu_err = device_vs_cpu = 0.0;
      out_numel = d.numel();
    }
    any = true;
    if (!informative) informative = ref.ne(0).any().item<bool>();
    device_err = worse(device_err, rel_l2(d, ref));
    cpu_err = worse(cpu_err, rel_l2(cpu, ref));
    device_vs_cpu = worse(device_vs_cpu, rel_l2(d, cpu));
    const double du = max_ulp(d, ref), cu = max_ulp(cpu, ref);
    if (du >= 0 && cu >= 0) {
      device_ulp = std::max(device_ulp, du);
      cpu_ulp = std::max(cpu_ulp, cu);
    }
  }

  // Into a call's measure or one list element's: the bridge's two structs
  // carry the same fields.
  template <class Out>
  void write_to(Out& out) const {
    out.device_err = device_err;
    out.cpu_err = cpu_err;
    out.device_vs_cpu = device_vs_cpu;
    out.device_ulp = device_ulp;
    out.cpu_ulp = cpu_ulp;
    out.out_numel = out_numel;
    out.informative = informative;
  }
};

void push_shape(rust::Vec<int64_t>& out, const at::Tensor& t) {
  if (!is_float(t)) return;
  out.push_back(t.dim());
  for (const int64_t d : t.sizes()) out.push_back(d);
}

// A list op (`_foreach_*`, `_fused_adamw_`) computes element i of its
// output lists from element i of its input lists: each element is measured
// on its own, so that one wrong parameter is not averaged away and the
// report can name it.
void measure_elements(const Job& job, const std::vector<c10::IValue>& dev, const std::vector<c10::IValue>& ref,
                      const std::vector<c10::IValue>& cpu, CheckMeasure& r) {
  size_t n = 0;
  for (const auto& v : dev)
    if (is_tensor_list(v)) n = std::max(n, list_size(v));
  for (size_t i = 0; i < n; ++i) {
    Errors e;
    for (size_t k = 0; k < dev.size() && k < ref.size() && k < cpu.size(); ++k) {
      if (!is_tensor_list(dev[k]) || !is_tensor_list(ref[k]) || !is_tensor_list(cpu[k])) continue;
      if (i >= list_size(dev[k]) || i >= list_size(ref[k]) || i >= list_size(cpu[k])) continue;
      e.add(list_at(dev[k], i), list_at(ref[k], i), list_at(cpu[k], i));
    }
    CheckElement el{};
    el.index = static_cast<int64_t>(i);
    if (i < job.names.size()) el.name = rust::String(job.names[i]);
    e.write_to(el);
    for (const auto& v : job.inputs) {
      if (is_tensor_list(v)) {
        if (i < list_size(v)) push_shape(el.float_input_shapes, list_at(v, i));
      } else if (v.isTensor()) {
        push_shape(el.float_input_shapes, v.toTensor());
      }
    }
    if (!e.any) el.why = rust::String("no floating-point output to compare");
    r.elements.push_back(std::move(el));
  }
}

void measure(Job& job, const RerunScope& op, CheckMeasure& r) {
  const size_t returns = job.op.returns;
  for (const auto& v : job.inputs)
    for_each_tensor(v, [&](const at::Tensor& t) { push_shape(r.float_input_shapes, t); });
  // The written arguments are taken from the copies before the run: the
  // run writes the same tensors.
  std::vector<c10::IValue> ref, cpu;
  try {
    torch::jit::Stack in = std::move(job.inputs64);
    std::vector<c10::IValue> written = picked(in, job.written);
    torch::jit::Stack out = run_on_cpu(op, std::move(in));
    ref = job.outputs_written ? std::move(written) : last_values(out, returns);
  } catch (const NoRerun& e) {
    r.why = rust::String(e.what());
    return;
  } catch (const std::exception& e) {
    r.why = rust::String("no float64 CPU kernel for these inputs (" + first_line(e) + ")");
    return;
  }
  try {
    // An op that writes its arguments runs on clones: the copies as they
    // were before it ran are the capture's.
    torch::jit::Stack in = job.written.empty() ? job.inputs : cloned(job.inputs);
    std::vector<c10::IValue> written = picked(in, job.written);
    torch::jit::Stack out = run_on_cpu(op, std::move(in));
    cpu = job.outputs_written ? std::move(written) : last_values(out, returns);
  } catch (const NoRerun& e) {
    r.why = rust::String(e.what());
    return;
  } catch (const std::exception& e) {
    r.why = rust::String("no CPU kernel for these inputs in their own dtypes (" + first_line(e) + ")");
    return;
  }
  const std::vector<c10::IValue>& dev = job.outputs;
  if (std::any_of(dev.begin(), dev.end(), is_tensor_list)) {
    measure_elements(job, dev, ref, cpu, r);
    if (r.elements.empty()) r.why = rust::String("no floating-point output to compare");
    return;
  }
  Errors e;
  for (size_t k = 0; k < dev.size() && k < ref.size() && k < cpu.size(); ++k)
    if (dev[k].isTensor() && ref[k].isTensor() && cpu[k].isTensor())
      e.add(dev[k].toTensor(), ref[k].toTensor(), cpu[k].toTensor());
  if (!e.any) {
    r.why = rust::String("no floating-point output to compare");
    return;
  }
  e.write_to(r);
}

// A failed call's capture: its inputs before it ran, its device outputs.
void capture(Job& job, const RerunScope& op) {
  OpCall call{};
  try {
    save_inputs(call, op.handle().schema(), job.inputs, /*budgeted=*/false);
    const auto& schema = op.handle().schema();
    if (job.outputs_written) {
      std::vector<std::pair<std::string, c10::IValue>> by_name;
      for (size_t k = 0; k < job.written.size() && k < job.outputs.size(); ++k)
        by_name.emplace_back(schema.arguments()[job.written[k]].name(), job.outputs[k]);
      save_outputs(call, schema, {}, by_name, /*budgeted=*/false);
    } else {
      save_outputs(call, schema, job.outputs, {}, /*budgeted=*/false);
    }
  } catch (const std::exception&) {
    call.captured = false;
    call.saved.clear();
  }
  check_captured(job.id, call);
}

void run(Job job) {
  const auto t0 = std::chrono::steady_clock::now();
  CheckMeasure r{};
  r.device = rust::String(job.device);
  r.dtype = rust::String(job.dtype);
  r.device_err = r.cpu_err = r.device_vs_cpu = r.device_ulp = r.cpu_ulp = -1.0;
  std::optional<RerunScope> op;
  try {
    if (job.op.no_tensor_result) throw NoRerun("no floating-point output to compare");
    op.emplace(job.op);
    measure(job, *op, r);
  } catch (const NoRerun& e) {
    r.why = rust::String(e.what());
  } catch (const std::exception& e) {
    r.why = rust::String("measuring failed (" + first_line(e) + ")");
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool failed = check_measured(job.id, r);
  if (failed && op) capture(job, *op);
  // Tensors a Python kernel saw carry Python objects, freed with the GIL:
  // they go while the scope holds it, and Python's exit waits for it.
  job.inputs.clear();
  job.inputs64.clear();
  job.outputs.clear();
  op.reset();
}

void worker() {
  c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
  Queue& q = queue();
  for (;;) {
    std::optional<Job> job;
    {
      std::unique_lock lock(q.m);
      q.cv.wait(lock, [&] { return !q.jobs.empty(); });
      job.emplace(std::move(q.jobs.front()));
      q.jobs.pop_front();
    }
    try {
      run(std::move(*job));
    } catch (const std::exception&) {
      // check_measured and check_captured catch their own; a torch error
      // while building the result leaves the check unfinished. Nothing
      // else is caught: Python ends this thread at its exit by unwinding
      // it (abi::__forced_unwind), which must go on.
    }
  }
}

void describe(std::ostringstream& s, const at::Tensor& t) {
  if (!t.defined()) {
    s << "None";
    return;
  }
  s << c10::getDtypeNames(t.scalar_type()).first << t.sizes();
}

}  // namespace

std::string call_signature(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                           std::string_view args_text) {
  const auto& name = op.operator_name();
  std::ostringstream s;
  s << name.name << '.' << (name.overload_name.empty() ? "default" : name.overload_name) << '(';
  const size_t args = op.schema().arguments().size();
  bool first = true;
  for (size_t i = stack.size() - std::min(args, stack.size()); i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (!v.isTensor() && !v.isTensorList() && !(v.isList() && v.toListRef().size() > 0 && v.toListRef()[0].isTensor()))
      continue;
    if (!first) s << ", ";
    first = false;
    if (v.isTensor()) {
      describe(s, v.toTensor());
      continue;
    }
    s << '[';
    bool first_element = true;
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!first_element) s << ", ";
      first_element = false;
      describe(s, t);
    });
    s << ']';
  }
  if (!args_text.empty()) s << "; " << args_text;
  s << ')';
  return s.str();
}

uint64_t input_bytes(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t args = op.schema().arguments().size();
  uint64_t bytes = 0;
  for (size_t i = stack.size() - std::min(args, stack.size()); i < stack.size(); ++i)
    for_each_tensor(stack[i], [&](const at::Tensor& t) {
      if (t.defined()) bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
    });
  return bytes;
}

AccuracyCheckStart accuracy_check_start(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  AccuracyCheckStart start;
  start.inputs = cpu_check_inputs(op, stack);
  const auto& args = op.schema().arguments();
  const size_t n = std::min(args.size(), stack.size());
  const size_t first = stack.size() - n;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = stack[first + i];
    if (args[i].alias_info() != nullptr && args[i].alias_info()->isWrite()) {
      start.written.push_back(i);
      start.written_values.push_back(v);
    }
    // Each element's name: the first of its lists' tensors that is a
    // parameter, a buffer or a parameter's gradient.
    if (!is_tensor_list(v)) continue;
    const size_t size = list_size(v);
    if (start.names.size() < size) start.names.resize(size);
    for (size_t j = 0; j < size; ++j) {
      if (!start.names[j].empty()) continue;
      const at::Tensor t = list_at(v, j);
      if (t.defined()) start.names[j] = std::string(tensor_name(t));
    }
  }
  return start;
}

void accuracy_check_enqueue(int64_t id, AccuracyCheckStart&& start, const c10::OperatorHandle& op,
                            const torch::jit::Stack& stack) {
  Job job{id,
          rerun_op(op),
          std::move(start.inputs.inputs64),
          std::move(start.inputs.inputs),
          std::move(start.written),
          false,
          {},
          std::move(start.names),
          "",
          ""};
  {
    c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
    auto note_device = [&](const at::Tensor& t) {
      if (job.device.empty() && is_float(t)) {
        job.device = t.device().str();
        job.dtype = c10::getDtypeNames(t.scalar_type()).first;
      }
    };
    const size_t returns = std::min(op.schema().returns().size(), stack.size());
    bool returns_tensor = false;
    for (size_t i = stack.size() - returns; i < stack.size(); ++i)
      for_each_tensor(stack[i], [&](const at::Tensor&) { returns_tensor = true; });
    job.outputs_written = !returns_tensor && !start.written_values.empty();
    if (job.outputs_written) {
      for (const c10::IValue& v : start.written_values) {
        for_each_tensor(v, note_device);
        job.outputs.push_back(on_host(v, false));
      }
    } else {
      for (size_t i = stack.size() - returns; i < stack.size(); ++i) {
        for_each_tensor(stack[i], note_device);
        job.outputs.push_back(on_host(stack[i], false));
      }
    }
  }
  Queue& q = queue();
  {
    std::lock_guard lock(q.m);
    if (!q.abandoned) {
      if (!q.started) {
        python_watch_exit();
        start_thread("opdump-check", worker);
        q.started = true;
      }
      q.jobs.push_back(std::move(job));
      q.cv.notify_one();
      return;
    }
  }
  check_dropped(id, true);
}

void check_abandon() {
  std::deque<Job> dropped;
  {
    Queue& q = queue();
    std::lock_guard lock(q.m);
    q.abandoned = true;
    dropped.swap(q.jobs);
  }
  for (const Job& job : dropped) check_dropped(job.id, true);
}

}  // namespace opdump
