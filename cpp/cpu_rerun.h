// Running a call again on the CPU from host copies of its arguments, and
// measuring outputs against a float64 result: shared by online compare's
// check of the call it names (cpu_check.cpp) and the accuracy check of
// every signature (accuracy_check.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace opdump {

bool is_float(const at::Tensor& t);

// A host copy of a value, its tensors detached; `to64` casts floating
// tensors to float64. Devices named in arguments become the CPU.
c10::IValue on_host(const c10::IValue& v, bool to64);

// The tensors among the last `returns` values of `stack`.
std::vector<at::Tensor> returned_tensors(const torch::jit::Stack& stack, size_t returns);

// ||x - ref||_2 / ||ref||_2 over the elements finite in both, in float64;
// NaN where x has a non-finite value ref does not.
double rel_l2(const at::Tensor& x, const at::Tensor& ref);

// The largest distance of x from ref rounded to x's dtype, in units in the
// last place of that dtype at ref; -1 where the dtype has no nextafter.
double max_ulp(const at::Tensor& x, const at::Tensor& ref64);

// Runs `op` on the CPU from `stack` (host values), below autograd; the
// caller excludes opdump's key.
torch::jit::Stack run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack stack);

}  // namespace opdump
