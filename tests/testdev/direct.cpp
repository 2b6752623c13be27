// Direct kernels of the testdev backend (direct.h).
//
// The fallback (faults.cpp) copies every testdev argument to the CPU, runs
// the CPU kernel and copies every result back: an allocation and a copy per
// tensor, each way. A real device runs the op where the data is. For the ops
// in kDirectOps, the ones an observer's statistics of a device tensor use,
// testdev does the same, so that measuring a tensor costs what the op costs
// and not mostly the fallback's copies. A direct kernel:
//   1. gives the CPU kernel host aliases of its testdev arguments (CPU
//      tensors over the same memory: no copy);
//   2. runs the op's CPU kernel;
//   3. gives back a result that is an argument's alias (in-place ops return
//      self) as that argument, and adopts every other CPU result as a testdev
//      tensor over the same memory (no copy; the device's memory counters
//      count it while it lives);
//   4. applies the fault that names the op, if one does, as the fallback
//      does: faults act on every op that runs on the CPU.
// It counts one launch, like the fallback.

#include "direct.h"

#include "counters.h"
#include "device.h"
#include "faults.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

namespace testdev {
namespace {

// The ops served by direct kernels, one per line. Any op qualifies whose
// arguments hold no generator (CPU kernels reject a testdev one), and which
// has no CPU kernel of its own if it takes a Device (see direct_kernel);
// register_direct_kernels checks both.
constexpr const char* kDirectOps[] = {
    "aten::_to_copy",
    "aten::abs",
    "aten::nan_to_num",
    "aten::eq.Tensor",
    "aten::eq.Scalar",
    "aten::ne.Tensor",
    "aten::ne.Scalar",
    "aten::sum",
    "aten::sum.dim_IntList",
    "aten::div.Tensor",
    "aten::sub.Tensor",
    "aten::mul.Tensor",
    "aten::where.self",
    "aten::var_mean.correction",
    "aten::aminmax",
    "aten::cat",
    "aten::dot",
    "aten::isnan",
    "aten::isinf",
    "aten::isposinf",
    "aten::isneginf",
    "aten::fill_.Scalar",
    "aten::zero_",
    "aten::clone",
    "aten::amin",
    "aten::amax",
    "aten::min",
    "aten::max",
    // What opdump's staged measurements add: segment reductions, and the
    // mean of each segment spread back over its elements.
    "aten::segment_reduce",
    "aten::repeat_interleave.Tensor",
    "aten::index_select",
    // What its fingerprints and sketches add: 32-bit hashes in int64
    // arithmetic, and the signed sums into buckets.
    "aten::bitwise_and.Scalar",
    "aten::bitwise_and.Tensor",
    "aten::bitwise_xor.Tensor",
    "aten::bitwise_xor.Scalar",
    "aten::__rshift__.Scalar",
    "aten::__lshift__.Scalar",
    "aten::bitwise_right_shift.Tensor",
    "aten::add.Tensor",
    "aten::add.Scalar",
    "aten::mul.Scalar",
    "aten::masked_fill.Scalar",
    "aten::index_add_",
};

// Read once, when the library loads; built on first use (testdev.cpp's
// static initialiser calls register_direct_kernels).
struct Settings {
  bool enabled = true;
  std::string env_error;
};

Settings& settings() {
  static Settings* s = new Settings();
  return *s;
}

void read_env() {
  const char* env = std::getenv("TESTDEV_DIRECT");
  if (env == nullptr) return;
  const std::string v(env);
  if (v.empty() || v == "1") return;
  if (v == "0") {
    settings().enabled = false;
    return;
  }
  settings().env_error = "TESTDEV_DIRECT=\"" + v + "\" is not 0 or 1 (the direct kernels stay on)";
  std::fprintf(stderr, "testdev: ignoring %s\n", settings().env_error.c_str());
}

// The context of an adopted result's DataPtr: it keeps the CPU kernel's
// memory alive, and gives its size back to the memory counters at the end.
struct Adopted {
  c10::Storage host;
  size_t nbytes;

  static void release(void* ctx) {
    auto* a = static_cast<Adopted*>(ctx);
    memory_released(a->nbytes);
    delete a;
  }
};

// A testdev storage over the memory of a CPU storage. It is resizable through
// the device's allocator (resize_ then moves it to memory of the device's
// own), so an adopted result serves as an out= argument like any other.
c10::Storage adopt(const c10::Storage& host) {
  auto* ctx = new Adopted{host, host.nbytes()};
  memory_acquired(ctx->nbytes);
  c10::DataPtr ptr(ctx->host.mutable_data(), ctx, &Adopted::release, c10::Device(kDev, 0));
  return c10::Storage(c10::Storage::use_byte_size_t(), ctx->nbytes, std::move(ptr),
                      c10::GetAllocator(kDev), /*resizable=*/true);
}

// A testdev tensor on `storage` with the dtype and geometry of `like`.
at::Tensor on_storage(c10::Storage storage, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                 like.storage_offset());
  return t;
}

// Calls fn on each tensor a value holds (a Tensor, or those of a Tensor[] or
// Tensor?[]) and returns the value with fn's results in their place.
template <typename Fn>
c10::IValue map_tensors(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (!v.isList()) return v;
  auto list = v.toList().copy();  // same element type: Tensor[] stays Tensor[]
  for (size_t i = 0; i < list.size(); ++i) {
    const c10::IValue e = list.get(i);
    if (e.isTensor()) list.set(i, fn(e.toTensor()));
  }
  return list;
}

// The arguments of one call as its CPU kernel sees them, and how its results
// come back to the device.
class HostCall {
 public:
  // The argument as the CPU kernel gets it: testdev tensors by their host
  // aliases, a Device naming testdev as the CPU (_to_copy(device=testdev)
  // then makes a CPU result, adopted below).
  c10::IValue to_host(const c10::IValue& v) {
    if (v.isDevice() && v.toDevice().type() == kDev) return c10::Device(c10::DeviceType::CPU);
    return map_tensors(v, [this](const at::Tensor& t) { return alias(t); });
  }

  // The result as the device gives it back.
  c10::IValue to_device(const c10::IValue& v) {
    return map_tensors(v, [this](const at::Tensor& t) { return result(t); });
  }

 private:
  at::Tensor alias(const at::Tensor& t) {
    if (!t.defined()) return t;
    at::Tensor a = host_alias(t);
    aliases_.emplace_back(a, t);
    return a;
  }

  at::Tensor result(const at::Tensor& out) {
    if (!out.defined() || !out.is_cpu()) return out;
    for (const auto& [a, original] : aliases_) {
      if (a.unsafeGetTensorImpl() == out.unsafeGetTensorImpl()) return original;  // self
    }
    const c10::StorageImpl* memory = out.storage().unsafeGetStorageImpl();
    for (const auto& [a, original] : aliases_) {  // a view of an argument
      if (a.storage().unsafeGetStorageImpl() == memory) {
        return original.is_cpu() ? out : on_storage(original.storage(), out);
      }
    }
    for (const auto& [host, storage] : adopted_) {  // results that share memory share it here
      if (host == memory) return on_storage(storage, out);
    }
    adopted_.emplace_back(memory, adopt(out.storage()));
    return on_storage(adopted_.back().second, out);
  }

  std::vector<std::pair<at::Tensor, at::Tensor>> aliases_;  // (host alias, argument)
  std::vector<std::pair<const c10::StorageImpl*, c10::Storage>> adopted_;  // (CPU, testdev)
};

// Whether a Device argument names another device: x.to("cpu") and
// x.to("cpu", torch.float64) are _to_copy(device=cpu).
bool to_another_device(const torch::jit::Stack& stack, size_t first) {
  for (size_t i = first; i < stack.size(); ++i) {
    if (stack[i].isDevice() && stack[i].toDevice().type() != kDev) return true;
  }
  return false;
}

void direct_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  if (to_another_device(*stack, first)) {
    // A copy across devices, not work on this one: it takes the op's generic
    // kernel, which is the CPU's entry (the op has no CPU kernel of its own,
    // register_direct_kernels checks). That kernel allocates on the other
    // device and copies with copy_, as without direct kernels, so _copy_from
    // counts the launch and, when it blocks, the host wait.
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    return;
  }
  Launch launch;
  trace_direct_op(op);
  const std::shared_ptr<Fault> fault = fault_for(op);
  std::vector<at::Tensor> outputs;  // for the fault: written arguments, then results
  HostCall call;
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    const auto* alias = args[i].alias_info();
    if (fault && alias != nullptr && alias->isWrite()) collect_tensors(v, outputs);
    v = call.to_host(v);
  }
  {
    // The dispatcher calls the CPU kernel makes itself (the parts of a
    // generic kernel such as sum's or clone's) see host aliases: hidden from
    // an observer, which sees the op once, on testdev, as with a device's
    // own kernel.
    c10::impl::ExcludeDispatchKeyGuard hidden(c10::DispatchKey::TESTING_ONLY_GenericMode);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  const size_t num_returns = op.schema().returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    (*stack)[i] = call.to_device((*stack)[i]);
    if (fault) collect_tensors((*stack)[i], outputs);
  }
  if (fault) apply_fault(*fault, outputs);
}

// `type`, or the type inside an Optional.
c10::TypePtr unwrap_optional(const c10::TypePtr& type) {
  if (auto opt = type->cast<c10::OptionalType>()) return opt->getElementType();
  return type;
}

void check_direct_op(const char* name, const c10::OperatorHandle& op) {
  bool takes_device = false;
  for (const auto& a : op.schema().arguments()) {
    const auto kind = unwrap_optional(a.type())->kind();
    TORCH_CHECK(kind != c10::TypeKind::GeneratorType, "testdev: direct op ", name,
                " takes a generator, which its CPU kernel would reject");
    takes_device = takes_device || kind == c10::TypeKind::DeviceObjType;
  }
  TORCH_CHECK(!takes_device || !op.hasKernelForDispatchKey(c10::DispatchKey::CPU),
              "testdev: direct op ", name,
              " takes a Device and has a CPU kernel: a copy to another device would run "
              "that kernel on testdev tensors");
}

}  // namespace

void register_direct_kernels(torch::Library& m) {
  read_env();
  if (!settings().enabled) return;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const char* name : kDirectOps) {
    const std::string full(name);
    const auto dot = full.find('.');
    const c10::OperatorName on(full.substr(0, dot),
                               dot == std::string::npos ? "" : full.substr(dot + 1));
    const auto op = dispatcher.findSchema(on);
    TORCH_CHECK(op.has_value(), "testdev: direct op ", name, " is not a registered operator");
    check_direct_op(name, *op);
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&direct_kernel>());
  }
}

bool direct_enabled() {
  return settings().enabled;
}

std::string env_direct_error() {
  return settings().env_error;
}

}  // namespace testdev
