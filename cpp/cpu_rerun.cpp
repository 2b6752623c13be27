// See cpu_rerun.h.

#include "opdump/cpp/cpu_rerun.h"

#include <algorithm>
#include <limits>

#include "opdump/cpp/internal.h"

namespace opdump {

bool is_float(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

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

double rel_l2(const at::Tensor& x, const at::Tensor& ref) {
  at::Tensor a = x.to(at::kDouble), r = ref.to(at::kDouble);
  at::Tensor fin_a = at::isfinite(a), fin_r = at::isfinite(r);
  // A NaN or infinity the reference does not have is as far off as can be.
  if ((fin_r & ~fin_a).any().item<bool>()) return std::numeric_limits<double>::quiet_NaN();
  at::Tensor finite = fin_a & fin_r;
  at::Tensor zero = at::zeros({}, r.options());
  const double num = at::where(finite, a - r, zero).norm().item<double>();
  const double den = at::where(finite, r, zero).norm().item<double>();
  if (den == 0.0) return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return num / den;
}

double max_ulp(const at::Tensor& x, const at::Tensor& ref64) {
  if (x.numel() == 0) return 0.0;
  const auto dt = x.scalar_type();
  if (dt != at::kFloat && dt != at::kDouble) return -1.0;  // nextafter is float and double only
  at::Tensor r = ref64.to(dt);
  at::Tensor finite = at::isfinite(x) & at::isfinite(r);
  at::Tensor mag = r.abs();
  at::Tensor ulp = (at::nextafter(mag, at::full({}, std::numeric_limits<double>::infinity(), mag.options())) - mag)
                       .to(at::kDouble);
  at::Tensor d = (x.to(at::kDouble) - ref64.to(at::kDouble)).abs() / ulp;
  d = at::where(finite, d, at::zeros({}, d.options()));
  return d.max().item<double>();
}

torch::jit::Stack run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack stack) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  op.callBoxed(&stack);
  return stack;
}

}  // namespace opdump
