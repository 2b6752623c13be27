// Running a call again on the CPU from host copies of its arguments, and
// measuring outputs against a float64 result: shared by online compare's
// check of the call it names (cpu_check.cpp) and the accuracy check of
// every signature (accuracy_check.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
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

// An op as a rerun names it. The call's OperatorHandle is not kept past
// the call: the op may be deregistered before its rerun runs (a scoped
// torch.library op dropped while its check waits), and a handle to it would
// then point at freed memory. The rerun finds the op again by name.
struct RerunOp {
  c10::OperatorName name;
  size_t returns = 0;
  // It returns no tensor and writes none (profiler ranges, asserts, a
  // custom op's side effect): a rerun could only repeat its side effect,
  // on objects of the job's, and has nothing to compare.
  bool no_tensor_result = false;
};
RerunOp rerun_op(const c10::OperatorHandle& op);

// Why a call cannot run again: the op is gone, or it draws random numbers
// (another draw gives another right answer, and drawing would move the
// job's generator). Its text is the check's reason.
struct NoRerun : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The op found again for the time this scope lives. For an op outside
// torch's own namespaces (a custom op, maybe with a Python kernel) it holds
// the GIL, under which alone Python can deregister it. Throws NoRerun when
// the op is gone.
class RerunScope {
 public:
  explicit RerunScope(const RerunOp& op);
  ~RerunScope();
  RerunScope(const RerunScope&) = delete;
  RerunScope& operator=(const RerunScope&) = delete;
  const c10::OperatorHandle& handle() const { return *handle_; }

 private:
  int gil_ = -1;  // what python_rerun_enter returned, else -1
  std::optional<c10::OperatorHandle> handle_;
};

// Runs the op on the CPU from `stack` (host values), below autograd and
// unseen by opdump. Any op it calls that takes a random generator stops
// it before the generator is touched (NoRerun): the job's CPU and device
// generators are exactly as they would be without opdump.
torch::jit::Stack run_on_cpu(const RerunScope& op, torch::jit::Stack stack);

// On a thread inside run_on_cpu, the hook fallback calls this instead of
// its own work (fallback.cpp).
bool rerunning_here();
void rerun_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

}  // namespace opdump
