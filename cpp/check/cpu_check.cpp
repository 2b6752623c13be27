// The CPU check of a call named by online compare (OPDUMP_REFERENCE): the
// call runs again on the CPU, from its inputs as they were before it ran,
// in float64 (the reference) and in the inputs' own dtypes (a known-good
// kernel at the same precision), and the device's outputs are measured
// against the float64 result. It says which device is off: the one far
// from float64 where the CPU at the same precision is near.
//
// The inputs and outputs are copied to the host on the job's thread (one
// call, once per run, as its capture does); the two CPU runs and the
// measuring happen on a thread of their own, whose result goes to Rust
// (cpu_check_done). The thread's calls skip opdump's key: they are not the
// job's.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/check/cpu_rerun.h"
#include "opdump/cpp/check/check.h"
#include "opdump/cpp/common/common.h"
#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/stats/stats.h"

namespace opdump {

namespace {

struct Pending {
  RerunOp op;  // found again when it runs: see cpu_rerun.h
  torch::jit::Stack inputs64, inputs;
  std::vector<at::Tensor> device_outputs;  // host copies
  size_t returns;
  std::string device, dtype;
};

void check(Pending p) {
  c10::impl::ExcludeDispatchKeyGuard unseen(kHookKey);
  CpuCheckResult r{};
  r.device = rust::String(p.device);
  r.dtype = rust::String(p.dtype);
  r.device_err = -1.0;
  r.cpu_err = -1.0;
  try {
    const RerunScope op(p.op);
    auto ref = returned_tensors(run_on_cpu(op, std::move(p.inputs64)), p.returns);
    auto cpu = returned_tensors(run_on_cpu(op, std::move(p.inputs)), p.returns);
    bool any = false;
    for (size_t i = 0; i < p.device_outputs.size() && i < ref.size() && i < cpu.size(); ++i) {
      const at::Tensor& d = p.device_outputs[i];
      if (!is_float(d) || !is_float(ref[i]) || d.sizes() != ref[i].sizes() || cpu[i].sizes() != ref[i].sizes()) continue;
      r.device_err = std::max(r.device_err, rel_l2(d, ref[i]));
      r.cpu_err = std::max(r.cpu_err, rel_l2(cpu[i], ref[i]));
      any = true;
    }
    if (!any) r.why = rust::String("no floating-point output to compare");
  } catch (const NoRerun& e) {
    r.why = rust::String(e.what());
  } catch (const std::exception& e) {
    std::string what = e.what();
    r.why = rust::String("the op does not run on the CPU from these inputs (" + what.substr(0, what.find('\n')) + ")");
  }
  cpu_check_done(r);
}

}  // namespace

CpuCheckInputs cpu_check_inputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
  CpuCheckInputs in;
  const size_t args = op.schema().arguments().size();
  const size_t first = stack.size() - std::min(args, stack.size());
  for (size_t i = first; i < stack.size(); ++i) {
    in.inputs64.push_back(on_host(stack[i], true));
    in.inputs.push_back(on_host(stack[i], false));
  }
  return in;
}

void cpu_check_start(CpuCheckInputs&& in, const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  c10::impl::ExcludeDispatchKeyGuard unseen(stats_excluded_keys());
  const size_t returns = op.schema().returns().size();
  Pending p{rerun_op(op), std::move(in.inputs64), std::move(in.inputs), {}, returns, "", ""};
  for (const at::Tensor& t : returned_tensors(stack, returns)) {
    if (p.device.empty() && t.defined()) {
      p.device = t.device().str();
      p.dtype = c10::getDtypeNames(t.scalar_type()).first;
    }
    p.device_outputs.push_back(t.defined() ? t.detach().to(at::kCPU, false, true) : t);
  }
  python_watch_exit();
  start_thread("opdump-cpu-check", [p = std::move(p)]() mutable { check(std::move(p)); });
}

}  // namespace opdump
