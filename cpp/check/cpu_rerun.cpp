// See cpu_rerun.h.

#include "opdump/cpp/check/cpu_rerun.h"

#include <algorithm>
#include <limits>

#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/common/common.h"
#include "opdump/cpp/hook/hook.h"

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

namespace {

bool holds_tensor(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::TensorType) return true;
  for (const c10::TypePtr& c : t->containedTypes())
    if (holds_tensor(c)) return true;
  return false;
}

// Whether a call of `schema` leaves a tensor to compare: one it returns, or
// an argument it writes.
bool tensor_result(const c10::FunctionSchema& schema) {
  for (const auto& r : schema.returns())
    if (holds_tensor(r.type())) return true;
  for (const auto& a : schema.arguments())
    if (a.alias_info() != nullptr && a.alias_info()->isWrite() && holds_tensor(a.type())) return true;
  return false;
}

}  // namespace

RerunOp rerun_op(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  return RerunOp{op.operator_name(), schema.returns().size(), !tensor_result(schema)};
}

namespace {

// Ops of these namespaces are torch's own, registered at load and never
// removed; any other may be deregistered from Python at any time.
bool never_deregistered(const std::string& name) { return name.starts_with("aten::") || name.starts_with("prims::"); }

thread_local bool t_rerunning = false;
thread_local std::string t_drew;  // the first op that would have drawn random numbers

NoRerun drew() { return NoRerun("random op: it draws random numbers (" + t_drew + ")"); }

// The rerun is under way on this thread while it lives, however it ends.
struct Rerunning {
  Rerunning() {
    t_rerunning = true;
    t_drew.clear();
  }
  ~Rerunning() { t_rerunning = false; }
};

// Whether the op takes a random generator: every op of ATen that draws
// random numbers (bernoulli_, normal_, rand, randperm, multinomial, the
// dropout kernels' masks) takes one, `Generator? generator`, so an op that
// draws anywhere inside it calls one of these.
bool takes_generator(const c10::FunctionSchema& schema) {
  for (const auto& a : schema.arguments()) {
    const c10::TypePtr& t = a.type();
    if (t->kind() == c10::TypeKind::GeneratorType) return true;
    if (t->kind() == c10::TypeKind::OptionalType &&
        t->containedType(0)->kind() == c10::TypeKind::GeneratorType)
      return true;
  }
  return false;
}

}  // namespace

RerunScope::RerunScope(const RerunOp& op) {
  if (!never_deregistered(op.name.name)) {
    gil_ = python_rerun_enter();
    if (gil_ == -2) {
      gil_ = -1;
      throw NoRerun("Python was exiting, or a torch.library was being removed, when its check would have run");
    }
  }
  handle_ = c10::Dispatcher::singleton().findSchema(op.name);
  if (!handle_) {
    python_rerun_leave(gil_);
    gil_ = -1;
    throw NoRerun("the op was removed before its check ran");
  }
}

RerunScope::~RerunScope() {
  handle_.reset();
  python_rerun_leave(gil_);
}

bool rerunning_here() { return t_rerunning; }

void rerun_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  if (takes_generator(op.schema())) {
    if (t_drew.empty()) t_drew = op.operator_name().name;
    throw drew();
  }
  op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kHookKey), stack);
}

torch::jit::Stack run_on_cpu(const RerunScope& op, torch::jit::Stack stack) {
  // opdump's key is switched on for this thread alone, so that every op
  // the rerun calls passes rerun_fallback, which records nothing.
  const c10::impl::LocalDispatchKeySet was = c10::impl::tls_local_dispatch_key_set();
  c10::impl::ForceDispatchKeyGuard keys(was.included_ | c10::DispatchKeySet(kHookKey),
                                        was.excluded_ - c10::DispatchKeySet(kHookKey));
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const Rerunning rerunning;
  try {
    op.handle().callBoxed(&stack);
  } catch (const std::exception&) {
    // A Python kernel turns the error into its own: the flag says why.
    if (!t_drew.empty()) throw drew();
    throw;
  }
  return stack;
}

}  // namespace opdump
