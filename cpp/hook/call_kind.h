// Where an op call comes from, as the dispatcher's thread-local state and
// its arguments tell (call_kind.cpp): from code above autograd, or from a
// compiler tracing on fake tensors.
#pragma once

#include <cstddef>

#include <ATen/core/stack.h>

namespace opdump {

// Whether the call goes through autograd and ADInplaceOrView, as the user's
// own calls do (writes at its level move version counters).
bool from_above_autograd();
// Whether the call is made by torch.compile, torch.export or make_fx while
// tracing; `num_args`: the number of its arguments on `stack`.
bool tracing_call(const torch::jit::Stack& stack, size_t num_args);

}  // namespace opdump
