// What an op's schema and stack say about one argument (call_args.cpp).
#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

namespace opdump {

// Whether the schema marks the argument as written (in place, out=).
inline bool is_written(const c10::Argument& a) { return a.alias_info() != nullptr && a.alias_info()->isWrite(); }
// Whether a value is a Tensor, or a list with at least one.
bool holds_tensors(const c10::IValue& v);
// Whether the argument's type is Tensor, Tensor?, Tensor[] or Tensor?[].
bool is_tensor_type(const c10::Argument& a);

}  // namespace opdump
