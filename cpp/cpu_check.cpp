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

#include <thread>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/internal.h"

namespace opdump {

namespace {

bool is_float(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

// A host copy of a value, its tensors detached; `to64` casts floating
// tensors to float64. Devices named in arguments become the CPU.
c10::IValue on_host(const c10::IValue& v, bool to64) {
  auto host = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    at::Tensor h = t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    return (to64 && is_float(h)) ? h.to(at::kDouble) : h;
  };
  if (v.isTensor()) return host(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(host(t));
    return out;
  }
  if (v.isList() && v.toListRef().size() > 0 && v.toListRef()[0].isTensor()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const auto& e : v.toListRef()) out.push_back(e.isTensor() ? std::optional(host(e.toTensor())) : std::nullopt);
    return out;
  }
  if (v.isDevice()) return c10::IValue(c10::Device(at::kCPU));
  return v;
}

std::vector<at::Tensor> returned_tensors(const torch::jit::Stack& stack, size_t returns) {
  std::vector<at::Tensor> out;
  for (size_t i = stack.size() - std::min(returns, stack.size()); i < stack.size(); ++i)
    for_each_tensor(stack[i], [&](const at::Tensor& t) { out.push_back(t); });
  return out;
}

// ||x - ref||_2 / ||ref||_2 over finite elements, in float64.
double rel_l2(const at::Tensor& x, const at::Tensor& ref) {
  at::Tensor a = x.to(at::kDouble), r = ref.to(at::kDouble);
  at::Tensor finite = at::isfinite(a) & at::isfinite(r);
  at::Tensor d = at::where(finite, a - r, at::zeros({}, r.options()));
  at::Tensor rr = at::where(finite, r, at::zeros({}, r.options()));
  const double num = d.norm().item<double>(), den = rr.norm().item<double>();
  if (den == 0.0) return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return num / den;
}

// Runs `op` on the CPU from `stack` (host values), without autograd
// (opdump's key is excluded by the caller).
torch::jit::Stack run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  op.callBoxed(&stack);
  return stack;
}

struct Pending {
  c10::OperatorHandle op;
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
    auto ref = returned_tensors(run_on_cpu(p.op, std::move(p.inputs64)), p.returns);
    auto cpu = returned_tensors(run_on_cpu(p.op, std::move(p.inputs)), p.returns);
    bool any = false;
    for (size_t i = 0; i < p.device_outputs.size() && i < ref.size() && i < cpu.size(); ++i) {
      const at::Tensor& d = p.device_outputs[i];
      if (!is_float(d) || !is_float(ref[i]) || d.sizes() != ref[i].sizes() || cpu[i].sizes() != ref[i].sizes()) continue;
      r.device_err = std::max(r.device_err, rel_l2(d, ref[i]));
      r.cpu_err = std::max(r.cpu_err, rel_l2(cpu[i], ref[i]));
      any = true;
    }
    if (!any) r.why = rust::String("no floating-point output to compare");
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
  Pending p{op, std::move(in.inputs64), std::move(in.inputs), {}, returns, "", ""};
  for (const at::Tensor& t : returned_tensors(stack, returns)) {
    if (p.device.empty() && t.defined()) {
      p.device = t.device().str();
      p.dtype = c10::getDtypeNames(t.scalar_type()).first;
    }
    p.device_outputs.push_back(t.defined() ? t.detach().to(at::kCPU, false, true) : t);
  }
  std::thread(check, std::move(p)).detach();
}

}  // namespace opdump
