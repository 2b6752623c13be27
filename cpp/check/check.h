// The checks of a call against the CPU, for the hook: the CPU check of online
// compare (cpu_check.cpp) and the accuracy check (accuracy_check.cpp). Both
// rerun the call on the CPU (check/cpu_rerun.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>

namespace opdump {

// The CPU check of a call named by online compare (cpu_check.cpp): its
// inputs copied to the host before it runs, in float64 and as they are;
// after it ran, its outputs are copied and the check goes on on a thread
// of its own, which hands the result to Rust (cpu_check_done).
struct CpuCheckInputs {
  std::vector<c10::IValue> inputs64, inputs;
};
CpuCheckInputs cpu_check_inputs(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);
void cpu_check_start(CpuCheckInputs&& in, const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);

// The accuracy check (OPDUMP_CHECK, accuracy_check.cpp): a call's
// signature (op, overload, tensor dtypes and shapes, the other arguments'
// text), the bytes of its input tensors, what is taken of a chosen call
// before it runs (accuracy_check_start), and, after it ran, the check of
// call `id` queued for the checking thread with its outputs copied.
std::string call_signature(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack,
                           std::string_view args_text);
uint64_t input_bytes(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);

// A chosen call before it runs: its inputs copied to the host, the
// arguments it writes (an op that returns nothing, `_foreach_add_`,
// `_fused_adamw_`, has only those as outputs), and per element of its
// tensor lists the first parameter name known for it.
struct AccuracyCheckStart {
  CpuCheckInputs inputs;
  std::vector<size_t> written;              // argument indices
  std::vector<c10::IValue> written_values;  // those arguments, on the device
  std::vector<std::string> names;           // by list index; empty where unknown
};
AccuracyCheckStart accuracy_check_start(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);
void accuracy_check_enqueue(int64_t id, AccuracyCheckStart&& start, const c10::OperatorHandle& op,
                            const std::vector<c10::IValue>& stack);

}  // namespace opdump
