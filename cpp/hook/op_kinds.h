// What an op's name says about its tensors (op_kinds.cpp, where each list
// says why it holds what it does). `op` is the base name, without the
// namespace.
#pragma once

#include <string_view>

#include <ATen/core/function_schema.h>

namespace opdump {

// "aten::add" -> "add".
std::string_view base_name(std::string_view qualified);
// Whether argument `a` holds values before the op runs (`writes`: the
// schema marks it as written).
bool input_values_defined(std::string_view op, const c10::Argument& a, bool writes);
// Whether the op's outputs get their values only after it returns
// (`qualified`: the name with its namespace).
bool outputs_asynchronous(std::string_view qualified);
// Views whose output holds exactly the values of their input.
bool preserves_values(std::string_view op, std::string_view overload);
// Of those, the views that also keep the elements' logical order.
bool preserves_order(std::string_view op);
// Ops whose outputs are memory without values yet.
bool output_uninitialized(std::string_view op);

}  // namespace opdump
