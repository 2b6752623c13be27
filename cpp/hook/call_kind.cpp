// Telling the job's op calls from those of a compiler's trace, and calls
// from above autograd from those inside kernels (see call_kind.h).

#include "opdump/cpp/hook/call_kind.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include "opdump/cpp/common/common.h"

namespace opdump {

// Whether this call goes through autograd and ADInplaceOrView, as the
// user's own calls do. Kernels below autograd run with both keys excluded
// (VariableType's AutoDispatchBelowADInplaceOrView), so a nested call that
// still has them comes from a composite op (linear, matmul, reshape), whose
// code only calls ops: every write it makes is dispatched and moves the
// version. Under inference_mode the keys are excluded everywhere and this is
// false below the top level.
bool from_above_autograd() {
  const auto excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
  return !excluded.has(c10::DispatchKey::ADInplaceOrView) && !excluded.has(c10::DispatchKey::AutogradCPU);
}

namespace {

// A FakeTensor: a tensor subclass (Python key) over memory on the meta
// device.
bool is_fake(const at::Tensor& t) {
  const auto* impl = t.unsafeGetTensorImpl();
  return impl->key_set().has(c10::DispatchKey::Python) && impl->unsafe_storage() &&
         impl->unsafe_storage().device_type() == c10::DeviceType::Meta;
}

}  // namespace

// Calls that torch.compile (Dynamo, AOTAutograd), torch.export or make_fx
// make while tracing: on fake tensors, under a fake or proxy mode. They
// compute nothing of the job's, and their number depends on the compiler,
// so they are not the job's op calls: not recorded, not counted by
// selectors. (The compiled code's own calls, at run time, are.)
bool tracing_call(const torch::jit::Stack& stack, size_t num_args) {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  if (TorchDispatchModeTLS::any_modes_set() &&
      (TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE) ||
       TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY)))
    return true;
  bool fake = false;
  for (size_t i = stack.size() - num_args; i < stack.size() && !fake; ++i)
    for_each_tensor(stack[i], [&](const at::Tensor& t) { fake = fake || is_fake(t); });
  return fake;
}

}  // namespace opdump
