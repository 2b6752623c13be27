// Planted faults of the testdev backend (see README.md, "Planted faults").
//
// The ops that run on the CPU apply faults: those on the fallback's path (the
// boxed CPU fallback, and the convolution hooks, which take the same path)
// and those served by direct kernels (direct.cpp). Such an op runs on the
// CPU, then the fault (if one names the op) rewrites the op's floating
// outputs in place, with plain loops over host memory, so that no further
// dispatcher call is made (an observer such as opdump sees nothing extra).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace testdev {

// Parses `spec` and makes it the active fault set (an empty spec clears all
// faults). Throws c10::ValueError, naming the bad part, when the spec is
// malformed; the previous fault set then stays active. Counts start at 0.
void set_fault(const std::string& spec);

// The active spec, normalised (`aten::gelu=scale:1.01;...`), "" when none.
std::string fault_spec();

// Per fault: normalised op name (`aten::gelu`) and how many calls it changed.
std::vector<std::pair<std::string, int64_t>> fault_counts();
void reset_fault_counts();

// Reads TESTDEV_FAULT once, when the library loads. A bad value is reported
// on stderr and kept here (load() in Python raises it); no fault is active.
void init_faults_from_env();
std::string env_fault_error();

// Optional trace of the ops that reach the CPU fallback (`aten::gelu.out`),
// and apart from them, of the ops served by direct kernels. set_trace clears
// both.
void set_trace(bool on);
std::vector<std::pair<std::string, int64_t>> traced_ops();
void trace_direct_op(const c10::OperatorHandle& op);
std::vector<std::pair<std::string, int64_t>> traced_direct_ops();

// One active fault (faults.cpp).
struct Fault;

// The fault that applies to this call of `reached`: the active one that names
// its op, unless the caller is an observer (TESTING_ONLY_GenericMode
// excluded). Null when none does. It keeps its fault set alive.
std::shared_ptr<Fault> fault_for(const c10::OperatorHandle& reached);

// Applies `f` to the floating testdev tensors among an op's outputs (each
// tensor once); the fault fires, and counts, when there is at least one.
void apply_fault(Fault& f, const std::vector<at::Tensor>& outputs);

// Appends the tensors of a Tensor or Tensor[] value to `out`.
void collect_tensors(const c10::IValue& v, std::vector<at::Tensor>& out);

// The boxed fallback registered for every op on PrivateUse1 that has no
// kernel of its own: runs the op through at::native::cpu_fallback, then
// applies the fault that names it, if any.
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Whether the fallback hides its own dispatcher calls from an observer
// (TESTDEV_HIDE_FALLBACK=1, read once).
bool fallback_hidden();

// The fallback's work for an op that reached the device as `reached` but runs
// on the CPU as `op`, whose arguments are on the stack: the device's kernels
// for convolution_overrideable and convolution_backward_overrideable (whose
// generic kernels raise) run aten::convolution and aten::convolution_backward.
// The trace and the fault go by `reached`: that is the op that reached the
// device.
void run_on_cpu(const c10::OperatorHandle& reached, const c10::OperatorHandle& op,
                torch::jit::Stack* stack);

} // namespace testdev
