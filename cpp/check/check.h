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
// text), the bytes of its input tensors, and, after it ran, the check of
// call `id` queued for the checking thread with its outputs copied.
std::string call_signature(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack,
                           std::string_view args_text);
uint64_t input_bytes(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);
void accuracy_check_enqueue(int64_t id, CpuCheckInputs&& in, const c10::OperatorHandle& op,
                            const std::vector<c10::IValue>& stack);

}  // namespace opdump
