// The text of an op call's arguments that are not tensors, as the record's
// `args` column holds it (arg_text.cpp).
#pragma once

#include <string>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

namespace opdump {

// Appends `name=value` for argument `arg`, after ", " unless `out` is empty.
// Dtypes, layouts and memory formats by name, numbers as Python prints them.
void append_arg_text(std::string& out, const c10::Argument& arg, const c10::IValue& v);

}  // namespace opdump
