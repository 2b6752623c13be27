// What the rows of a call are built from, for the other folders: the ids of
// interned names (interned.cpp), the names of parameters (param_names.cpp)
// and the full tensors of a chosen call (saved_call.cpp). The builder of a
// call's rows is in rows/row_builder.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Tensor.h>

#include "opdump/src/bridge.rs.h"

namespace opdump {

// Ids of interned names (interned.cpp), as TensorRow and OpCall carry them:
// asked of Rust once per distinct name, then cached. u32::MAX: not had,
// which fails the record.
uint32_t name_id(std::string_view name);
uint32_t dtype_name_id(at::ScalarType t);
uint32_t device_name_id(const at::Device& d);
// "0", "1", ...: the names of returns.
uint32_t return_name_id(size_t r);
struct OpNames {
  std::string name, overload;  // to tell a reused entry from the one cached
  uint32_t op = 0, overload_id = 0;
  std::vector<uint32_t> args;  // by the schema's argument index
};
// The calling thread's cached ids of an op's names.
const OpNames& op_names(const c10::OperatorHandle& op);

// Names of parameters, buffers and their gradients (param_names.cpp).
void names_add(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names);
void names_new_optimizer_scope();
rust::String tensor_name(const at::Tensor& t);

// The full tensors and typed arguments of a call OPDUMP_CAPTURE chose
// (saved_call.cpp): inputs before the op runs, outputs (the returns, or for
// an op that returns nothing the arguments it wrote, by name) after.
// `budgeted`: the bytes come from OPDUMP_CAPTURE_MAX_BYTES (the accuracy
// check's captures are bounded by its own cap instead).
void save_inputs(OpCall& call, const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                 bool budgeted = true);
void save_outputs(OpCall& call, const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                  const std::vector<std::pair<std::string, c10::IValue>>& written, bool budgeted = true);

}  // namespace opdump
