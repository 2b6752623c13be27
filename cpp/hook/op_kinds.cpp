// The tables of op names behind op_kinds.h.

#include "opdump/cpp/hook/op_kinds.h"

namespace opdump {

std::string_view base_name(std::string_view qualified) {
  auto pos = qualified.find("::");
  return pos == std::string_view::npos ? qualified : qualified.substr(pos + 2);
}

namespace {

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

}  // namespace

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

}  // namespace opdump
