// The accuracy check (OPDUMP_CHECK): a call Rust chose (check_wanted) runs
// again on the CPU from host copies of its inputs as they were before it
// ran, in float64 (the reference) and in its own dtypes, and its outputs on
// the device are measured against both (check_measured). A call that failed
// is saved as a capture file from the same host copies (check_captured).
//
// The job's thread only copies: the inputs before the op runs
// (cpu_check_inputs) and the outputs after (accuracy_check_enqueue). The
// CPU runs happen on one thread of opdump's own, fed by a queue whose bytes
// Rust bounds; its calls skip opdump's key and autograd.

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
  torch::jit::Stack outputs;           // the returns, host copies
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

bool writes_arguments(const c10::FunctionSchema& schema) {
  for (const auto& a : schema.arguments())
    if (a.alias_info() != nullptr && a.alias_info()->isWrite()) return true;
  return false;
}

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

void measure(Job& job, const RerunScope& op, CheckMeasure& r) {
  const auto& schema = op.handle().schema();
  const size_t returns = job.op.returns;
  for (const auto& v : job.inputs)
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!is_float(t)) return;
      r.float_input_shapes.push_back(t.dim());
      for (const int64_t d : t.sizes()) r.float_input_shapes.push_back(d);
    });
  std::vector<at::Tensor> ref, cpu;
  try {
    ref = returned_tensors(run_on_cpu(op, std::move(job.inputs64)), returns);
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
    cpu = returned_tensors(run_on_cpu(op, writes_arguments(schema) ? cloned(job.inputs) : job.inputs), returns);
  } catch (const NoRerun& e) {
    r.why = rust::String(e.what());
    return;
  } catch (const std::exception& e) {
    r.why = rust::String("no CPU kernel for these inputs in their own dtypes (" + first_line(e) + ")");
    return;
  }
  const auto dev = returned_tensors(job.outputs, returns);
  bool any = false;
  for (size_t i = 0; i < dev.size() && i < ref.size() && i < cpu.size(); ++i) {
    const at::Tensor& d = dev[i];
    if (!is_float(d) || !is_float(ref[i]) || d.sizes() != ref[i].sizes() || cpu[i].sizes() != ref[i].sizes()) continue;
    if (!any) {
      r.device_err = r.cpu_err = r.device_vs_cpu = 0.0;
      r.out_numel = d.numel();
    }
    any = true;
    r.device_err = worse(r.device_err, rel_l2(d, ref[i]));
    r.cpu_err = worse(r.cpu_err, rel_l2(cpu[i], ref[i]));
    r.device_vs_cpu = worse(r.device_vs_cpu, rel_l2(d, cpu[i]));
    const double du = max_ulp(d, ref[i]), cu = max_ulp(cpu[i], ref[i]);
    if (du >= 0 && cu >= 0) {
      r.device_ulp = std::max(r.device_ulp, du);
      r.cpu_ulp = std::max(r.cpu_ulp, cu);
    }
  }
  if (!any) r.why = rust::String("no floating-point output to compare");
}

// A failed call's capture: its inputs before it ran, its device outputs.
void capture(Job& job, const RerunScope& op) {
  OpCall call{};
  try {
    save_inputs(call, op.handle().schema(), job.inputs, /*budgeted=*/false);
    save_outputs(call, op.handle().schema(), job.outputs, {}, /*budgeted=*/false);
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

void accuracy_check_enqueue(int64_t id, CpuCheckInputs&& in, const c10::OperatorHandle& op,
                            const torch::jit::Stack& stack) {
  Job job{id, rerun_op(op), std::move(in.inputs64), std::move(in.inputs), {}, "", ""};
  {
    c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
    const size_t returns = std::min(op.schema().returns().size(), stack.size());
    for (size_t i = stack.size() - returns; i < stack.size(); ++i) {
      for_each_tensor(stack[i], [&](const at::Tensor& t) {
        if (job.device.empty() && is_float(t)) {
          job.device = t.device().str();
          job.dtype = c10::getDtypeNames(t.scalar_type()).first;
        }
      });
      job.outputs.push_back(on_host(stack[i], false));
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
