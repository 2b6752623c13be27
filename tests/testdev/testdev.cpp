// testdev: a PrivateUse1 backend for tests, whose tensors live in host memory.
//
// It gives a CPU-only machine a real second device. Python renames
// PrivateUse1 to "testdev" (tests/testdev/__init__.py). This file holds the
// device itself:
//   - an allocator for PrivateUse1 that hands out host memory;
//   - a device guard with one device (index 0) whose streams and events are
//     no-ops: work is synchronous (autograd's device thread, torch.Stream,
//     torch.Event and torch.accelerator all go through it);
//   - PrivateUse1 hooks (one device, a default generator, storage resize);
//   - the few kernels a device must own (allocation, views, copies across
//     devices, reading a scalar), listed in register_device_kernels();
//   - direct kernels for the ops an observer's statistics use (direct.cpp);
//   - a boxed fallback that runs every other op on the CPU (faults.cpp);
//   - what the device counts (counters.cpp): memory, host waits, launches,
//     graph capture, and simulated costs;
//   - an autocast policy, for torch.autocast(device_type="testdev")
//     (autocast.cpp).
// Nothing here is part of libopdump.so.
//
// Everything is registered from one static initialiser that first checks
// that PrivateUse1 is free: loading a second copy of this library (from
// another path) then leaves that copy inert instead of aborting the process
// inside dlopen ("multiple backend fallbacks for the same dispatch key").

#include "autocast.h"
#include "counters.h"
#include "device.h"
#include "direct.h"
#include "faults.h"
#include "fused_stats.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <memory>
#include <tuple>

namespace testdev {
namespace {

const c10::Device kDevice(kDev, 0);

std::string g_init_error;  // why this copy registered nothing, if it did not

// ---- memory ----------------------------------------------------------------

// Host memory, counted (counters.h). A block's size sits in a header before
// its data: the deleter gets only the data pointer, and must take the size
// off the count. The data pointer stays its own context, so raw_deleter()
// works too.
struct HostAllocator final : c10::Allocator {
  static constexpr size_t kHeader = 64;  // keeps alloc_cpu's 64-byte alignment

  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return {nullptr, nullptr, &release, kDevice};
    auto* base = static_cast<char*>(c10::alloc_cpu(nbytes + kHeader));
    *reinterpret_cast<size_t*>(base) = nbytes;
    memory_acquired(nbytes);
    void* p = base + kHeader;
    return {p, p, &release, kDevice};
  }
  static void release(void* p) {
    if (p == nullptr) return;
    char* base = static_cast<char*>(p) - kHeader;
    memory_released(*reinterpret_cast<size_t*>(base));
    c10::free_cpu(base);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

HostAllocator g_alloc;

void check_device(std::optional<c10::Device> device) {
  if (device && device->has_index()) {
    TORCH_CHECK(device->index() == 0, "testdev has a single device, index 0; got ", *device);
  }
}

}  // namespace

at::Tensor host_alias(const at::Tensor& t) {
  if (t.device().type() != kDev) return t;
  c10::Storage storage = t.storage();
  void* data = storage.mutable_data();
  c10::DataPtr ptr = c10::InefficientStdFunctionContext::makeDataPtr(
      data, [keep = storage](void*) {}, c10::Device(c10::DeviceType::CPU));
  c10::Storage host(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(ptr),
                    /*allocator=*/nullptr, /*resizable=*/false);
  auto alias = at::detail::make_tensor<c10::TensorImpl>(
      std::move(host), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(),
                                                    t.storage_offset());
  return alias;
}

namespace {
std::mutex g_switch_mutex;
std::string g_switch_errors;
}  // namespace

bool env_switch(const char* name, bool otherwise) {
  const char* env = std::getenv(name);
  if (env == nullptr || env[0] == '\0') return otherwise;
  const std::string v(env);
  if (v == "0" || v == "1") return v == "1";
  const std::string e = std::string(name) + "=\"" + v + "\" is not 0 or 1";
  std::fprintf(stderr, "testdev: ignoring %s\n", e.c_str());
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  g_switch_errors += (g_switch_errors.empty() ? "" : "; ") + e;
  return otherwise;
}

std::string env_switch_errors() {
  std::lock_guard<std::mutex> lock(g_switch_mutex);
  return g_switch_errors;
}

namespace {

// ---- device guard: one device, no-op streams and events -------------------

// Streams and events do nothing, but a synchronisation is a host wait
// (counters.h): counted, it costs TESTDEV_SYNC_US, and it is refused while
// the stream is capturing.
struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  static c10::Stream default_stream() {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::DeviceType type() const override {
    return kDev;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    check(d);
    return kDevice;
  }
  c10::Device getDevice() const override {
    return kDevice;
  }
  void setDevice(c10::Device d) const override {
    check(d);
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override {
    return default_stream();
  }
  c10::Stream getDefaultStream(c10::Device) const override {
    return default_stream();
  }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override {
    return default_stream();
  }
  c10::Stream getNewStream(c10::Device, int) const override {
    return default_stream();
  }
  c10::Stream exchangeStream(c10::Stream) const override {
    return default_stream();
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return 1;
  }
  // Work is synchronous, so every event is complete as soon as it exists.
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    return true;
  }
  void synchronizeEvent(void*) const override {
    host_wait();
  }
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {
    host_wait();
  }
  void synchronizeDevice(const c10::DeviceIndex) const override {
    host_wait();
  }
  double elapsedTime(void*, void*, const c10::DeviceIndex) const override {
    return 0.0;
  }

 private:
  static void check(c10::Device d) {
    TORCH_CHECK(d.type() == kDev, "testdev guard got a ", d.type(), " device");
    TORCH_CHECK(!d.has_index() || d.index() == 0,
                "testdev has a single device, index 0; got ", d);
  }
};

// ---- generator and hooks ---------------------------------------------------

// A CPU generator that says it belongs to testdev. Random ops that reach the
// device take the CPU fallback with no generator argument and so draw from
// the CPU default generator: the same seed gives the same numbers on cpu and
// testdev. This one serves torch.Generator("testdev") and
// torch.testdev.manual_seed; CPU kernels reject it as an explicit argument.
struct TestdevGenerator : public at::CPUGeneratorImpl {
  TestdevGenerator() {
    device_ = kDevice;
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return 1;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return 0;
  }
  void setCurrentDevice(c10::DeviceIndex) const override {}
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override {
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override {
    return 0;
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    static at::Generator gen = at::make_generator<TestdevGenerator>();
    return gen;
  }
  at::Generator getNewGenerator(c10::DeviceIndex) const override {
    return at::make_generator<TestdevGenerator>();
  }
  at::Device getDeviceFromPtr(void*) const override {
    return kDevice;
  }
  bool isPinnedPtr(const void*) const override {
    return false;
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    at::native::resize_bytes_cpu(storage.unsafeGetStorageImpl(), nbytes);
  }
};

// ---- kernels the device owns -----------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout,
                               std::optional<at::Device> device, std::optional<bool>,
                               std::optional<at::MemoryFormat> memory_format) {
  check_device(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::kStrided,
              "testdev supports strided tensors only");
  return at::detail::empty_generic(size, &g_alloc, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool>) {
  check_device(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::kStrided,
              "testdev supports strided tensors only");
  return at::detail::empty_strided_generic(size, stride, &g_alloc,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// copy_ between testdev and cpu (either way) or within testdev lands here
// (dtype conversion and broadcasting included): copy on host aliases. One
// launch; a copy to the host that does not say non_blocking is also a host
// wait. A non_blocking one is not: the work is synchronous, so the data is
// there when it returns anyway, and on CUDA the host would not wait for it.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  for (const auto* t : {&self, &dst}) {
    TORCH_CHECK(t->device().type() == kDev || t->device().is_cpu(),
                "testdev copies to and from cpu only, got a tensor on ", t->device());
  }
  Launch launch;
  if (!launch.nested() && !non_blocking && dst.is_cpu() && self.device().type() == kDev) {
    host_wait();
  }
  at::Tensor host_dst = host_alias(dst);
  at::native::copy_(host_dst, host_alias(self), non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

// .item(): host memory is directly readable, but reading it is a copy to the
// host that the host waits for, as on any device.
at::Scalar local_scalar_dense(const at::Tensor& self) {
  Launch launch;
  if (!launch.nested()) host_wait();
  return at::native::_local_scalar_dense_cpu(self);
}

// tensor.set_(): an empty tensor on testdev (the CPU kernel would give it a
// CPU storage).
at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_alloc, /*resizable=*/true);
  return at::native::set_storage_cpu_(self, storage, 0, {0}, {});
}

// Convolution. aten::convolution and aten::convolution_backward have generic
// kernels that pick a backend from the input's device. For a PrivateUse1
// tensor they call convolution_overrideable and
// convolution_backward_overrideable, the hooks PyTorch leaves to out-of-tree
// devices, whose own generic kernels raise. testdev's kernels for the hooks
// run the generic ops on CPU copies, on the fallback's path (run_on_cpu), so
// the CPU picks its usual kernel and the result is the CPU's bit for bit.
// The hooks are the ops that reach the device: they are what trace() lists
// and what a fault names. A conv1d arrives as a 2-d convolution over a height
// of 1 (the generic kernel expands it), which is also how the CPU runs it.

// Same arguments as aten::convolution.
void convolution_overrideable(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const auto cpu_op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  run_on_cpu(op, cpu_op, stack);
}

// (grad_output, input, weight, stride, padding, dilation, transposed,
// output_padding, groups, output_mask): aten::convolution_backward's
// arguments, less bias_sizes after weight. The bias's size is known (one entry
// per output channel), and only matters when its gradient is asked for.
void convolution_backward_overrideable(const c10::OperatorHandle& op,
                                       torch::jit::Stack* stack) {
  static const auto cpu_op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
  const size_t first = stack->size() - op.schema().arguments().size();
  const at::Tensor weight = (*stack)[first + 2].toTensor();
  const bool transposed = (*stack)[first + 6].toBool();
  const int64_t groups = (*stack)[first + 8].toSymInt().guard_int(__FILE__, __LINE__);
  const bool bias_grad = (*stack)[first + 9].toBoolList().get(2);
  c10::IValue bias_sizes;  // None
  if (bias_grad) {
    const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
    bias_sizes = c10::IValue(std::vector<int64_t>{channels});
  }
  stack->insert(stack->begin() + static_cast<std::ptrdiff_t>(first + 3), std::move(bias_sizes));
  run_on_cpu(op, cpu_op, stack);
}

// Module._apply (module.to("testdev")) assigns param.data = moved, keeping
// the Parameter object and so weights tied by sharing one, only when this
// says the two tensors are shallow-copy compatible. Otherwise it makes new
// Parameters, one per module, which unties them. TensorImpl's own rule lists
// the built-in dense backends only and leaves PrivateUse1 to override this
// op. testdev tensors are dense host tensors, as interchangeable with CPU
// ones as CUDA tensors are.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense_host = [](c10::DispatchKeySet ks) {
    return ks.has(c10::DispatchKey::CPU) || ks.has(c10::DispatchKey::PrivateUse1);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (dense_host(self.key_set()) && dense_host(from.key_set()));
}

// Everything else reaches the CPU fallback. Ops are listed here only when the
// fallback would be wrong for them, which is the case for:
//  - allocation (the fallback calls these itself);
//  - views: the fallback returns a copy, so writes through the view would
//    be lost. The list covers every aten view op with a CPU kernel and no
//    generic (CompositeExplicit/Implicit) one, as the dispatcher reports on
//    torch 2.15; the ATen kernels used only touch TensorImpl metadata;
//  - ops that change a tensor's metadata or storage in place (the fallback
//    would change a CPU copy);
//  - copies across devices and .item();
//  - ops whose generic kernel stands in front of the fallback and does the
//    wrong thing for testdev: the convolution hooks (they raise) and
//    _has_compatible_shallow_copy_type (it says no).
void register_device_kernels(torch::Library& m) {
  // Allocation: tensors get host memory from g_alloc.
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  // Views.
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  // In-place changes of metadata or storage. resize_ grows the storage
  // through its allocator (g_alloc).
  m.impl("resize_", TORCH_FN(at::native::resize_));
  m.impl("as_strided_", TORCH_FN(at::native::as_strided__symint));
  m.impl("set_.source_Storage", TORCH_FN(at::native::set_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(at::native::set_storage_cpu_));
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
  m.impl("set_", TORCH_FN(set_empty));
  // Copies across devices: copy_ and the fallback itself move data with them.
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  // .item(): a launch and a host wait.
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  // Convolution forward and backward, on the CPU.
  m.impl("convolution_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolution_overrideable>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolution_backward_overrideable>());
  // Module.to("testdev") keeps Parameters, and so tied weights.
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
}

// ---- control ops: torch.ops.testdev.* (wrapped by __init__.py) ---------------

std::tuple<std::vector<std::string>, std::vector<int64_t>> unzip(
    const std::vector<std::pair<std::string, int64_t>>& v) {
  std::tuple<std::vector<std::string>, std::vector<int64_t>> out;
  for (const auto& [name, n] : v) {
    std::get<0>(out).push_back(name);
    std::get<1>(out).push_back(n);
  }
  return out;
}

void op_set_fault(std::string spec) {
  set_fault(spec);
}
std::string op_fault_spec() {
  return fault_spec();
}
std::tuple<std::vector<std::string>, std::vector<int64_t>> op_fault_counts() {
  return unzip(fault_counts());
}
void op_reset_fault_counts() {
  reset_fault_counts();
}
std::string op_env_fault_error() {
  return env_fault_error();
}
std::string op_init_error() {
  return g_init_error;
}
void op_set_trace(bool on) {
  set_trace(on);
}
std::tuple<std::vector<std::string>, std::vector<int64_t>> op_traced_ops() {
  return unzip(traced_ops());
}
// Runs a one-tensor aten op (default overload) the way an observer such as
// opdump runs its own statistics: with TESTING_ONLY_GenericMode excluded.
at::Tensor op_call_unobserved(std::string name, const at::Tensor& x) {
  c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKey::TESTING_ONLY_GenericMode);
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "");
  torch::jit::Stack stack{x};
  const auto& args = handle.schema().arguments();
  for (size_t i = 1; i < args.size(); ++i) {
    TORCH_CHECK(args[i].default_value().has_value(), name, " takes more than one argument");
    stack.push_back(*args[i].default_value());
  }
  handle.callBoxed(stack);
  return stack.at(0).toTensor();
}
// What the environment asked for that could not be done (TESTDEV_FAULT is
// reported apart, by env_fault_error): "" when all is well.
std::string op_env_error() {
  std::string out;
  for (const std::string& e : {env_cost_error(), env_direct_error(), env_switch_errors()}) {
    if (!out.empty() && !e.empty()) out += "; ";
    out += e;
  }
  return out;
}
std::vector<int64_t> op_memory_stats() {
  return memory_stats();
}
void op_reset_peak_memory() {
  reset_peak_memory();
}
void op_set_job_thread() {
  set_job_thread();
}
std::vector<int64_t> op_host_waits() {
  return host_waits();
}
std::vector<int64_t> op_launches() {
  return launches();
}
void op_reset_counters() {
  reset_counters();
}
void op_set_costs(std::optional<double> sync_us, std::optional<double> launch_us) {
  set_costs(sync_us, launch_us);
}
std::vector<double> op_costs() {
  return costs();
}
bool op_fused_stats_enabled() {
  return fused_stats_enabled();
}
bool op_fallback_hidden() {
  return fallback_hidden();
}
bool op_direct_enabled() {
  return direct_enabled();
}
std::tuple<std::vector<std::string>, std::vector<int64_t>> op_traced_direct_ops() {
  return unzip(traced_direct_ops());
}
void op_capture_begin() {
  capture_begin();
}
void op_capture_end() {
  capture_end();
}
bool op_capturing() {
  return capturing();
}
std::vector<int64_t> op_capture_counts() {
  return capture_counts();
}
// torch.testdev.synchronize(): what torch.accelerator.synchronize() does, a
// host wait through the guard.
void op_synchronize() {
  c10::impl::getDeviceGuardImpl(kDev)->synchronizeDevice(0);
}

void register_control_ops(torch::Library& m) {
  m.def("set_fault(str spec) -> ()", TORCH_FN(op_set_fault));
  m.def("fault_spec() -> str", TORCH_FN(op_fault_spec));
  m.def("fault_counts() -> (str[], int[])", TORCH_FN(op_fault_counts));
  m.def("reset_fault_counts() -> ()", TORCH_FN(op_reset_fault_counts));
  m.def("env_fault_error() -> str", TORCH_FN(op_env_fault_error));
  m.def("init_error() -> str", TORCH_FN(op_init_error));
  m.def("set_trace(bool on) -> ()", TORCH_FN(op_set_trace));
  m.def("traced_ops() -> (str[], int[])", TORCH_FN(op_traced_ops));
  m.def("_call_unobserved(str name, Tensor x) -> Tensor", TORCH_FN(op_call_unobserved));
  m.def("env_error() -> str", TORCH_FN(op_env_error));
  m.def("memory_stats() -> int[]", TORCH_FN(op_memory_stats));
  m.def("reset_peak_memory() -> ()", TORCH_FN(op_reset_peak_memory));
  m.def("set_job_thread() -> ()", TORCH_FN(op_set_job_thread));
  m.def("host_waits() -> int[]", TORCH_FN(op_host_waits));
  m.def("launches() -> int[]", TORCH_FN(op_launches));
  m.def("reset_counters() -> ()", TORCH_FN(op_reset_counters));
  m.def("set_costs(float? sync_us, float? launch_us) -> ()", TORCH_FN(op_set_costs));
  m.def("costs() -> float[]", TORCH_FN(op_costs));
  m.def("direct_enabled() -> bool", TORCH_FN(op_direct_enabled));
  m.def("fused_stats_enabled() -> bool", TORCH_FN(op_fused_stats_enabled));
  m.def("fallback_hidden() -> bool", TORCH_FN(op_fallback_hidden));
  m.def("traced_direct_ops() -> (str[], int[])", TORCH_FN(op_traced_direct_ops));
  m.def("capture_begin() -> ()", TORCH_FN(op_capture_begin));
  m.def("capture_end() -> ()", TORCH_FN(op_capture_end));
  m.def("capturing() -> bool", TORCH_FN(op_capturing));
  m.def("capture_counts() -> int[]", TORCH_FN(op_capture_counts));
  m.def("synchronize() -> ()", TORCH_FN(op_synchronize));
}

// opdump::stream_capturing(Tensor t) -> bool, for a testdev tensor: whether
// a graph capture is marked on the device's stream. opdump defines the op
// (an observer asks it before it launches anything of its own); testdev only
// implements it for its key, so that it works whether or not opdump is
// loaded, and in either order: the dispatcher keeps an implementation that
// comes before its schema, and checks it against the schema when that comes.
bool stream_capturing(const at::Tensor&) {
  return capturing();
}

// Libraries live for the whole process (registrations end with them).
std::vector<std::unique_ptr<torch::Library>>& libraries() {
  static auto* libs = new std::vector<std::unique_ptr<torch::Library>>();
  return *libs;
}

// TESTDEV_FOREACH=1: the `_foreach_` ops run as one kernel each, on the CPU
// as the fallback runs any op, as a backend with its own multi-tensor
// kernels (CUDA's) runs them; otherwise PyTorch's composite slow path runs
// them as one op per tensor, as on the CPU.
void register_foreach_kernels(torch::Library& m) {
  if (!env_switch("TESTDEV_FOREACH", false)) return;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::_foreach_", 0) != 0) continue;
    const std::string bare = name.name.substr(6);
    // The library keeps the name: it must outlive the registration.
    static auto* names = new std::vector<std::unique_ptr<std::string>>;
    names->push_back(std::make_unique<std::string>(name.overload_name.empty() ? bare
                                                                              : bare + "." + name.overload_name));
    m.impl(names->back()->c_str(), torch::CppFunction::makeFromBoxedFunction<&testdev::fallback>());
  }
}

void register_all() {
  auto& dispatcher = c10::Dispatcher::singleton();
  if (dispatcher.findOp(c10::OperatorName("testdev::set_fault", ""))) {
    std::fprintf(stderr,
                 "testdev: another copy of libtestdev is already loaded; this copy stays "
                 "inactive\n");
    return;
  }
  auto& libs = libraries();
  libs.push_back(std::make_unique<torch::Library>(torch::Library::DEF, "testdev", std::nullopt,
                                                  __FILE__, __LINE__));
  register_control_ops(*libs.back());

  if (dispatcher.hasBackendFallbackForDispatchKey(c10::DispatchKey::PrivateUse1) ||
      c10::impl::hasDeviceGuardImpl(kDev) || at::isPrivateUse1HooksRegistered()) {
    g_init_error = "PrivateUse1 is already used by another backend in this process";
    std::fprintf(stderr, "testdev: %s; the testdev device is not registered\n",
                 g_init_error.c_str());
    return;
  }
  c10::SetAllocator(kDev, &g_alloc);
  static c10::impl::DeviceGuardImplRegistrar guard_registrar(kDev, new GuardImpl());
  at::RegisterPrivateUse1HooksInterface(new Hooks());

  libs.push_back(std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__));
  register_device_kernels(*libs.back());
  register_direct_kernels(*libs.back());
  register_foreach_kernels(*libs.back());
  libs.push_back(std::make_unique<torch::Library>(
      torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__));
  libs.back()->fallback(torch::CppFunction::makeFromBoxedFunction<&testdev::fallback>());
  libs.push_back(std::make_unique<torch::Library>(
      torch::Library::IMPL, "opdump", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__));
  libs.back()->impl("stream_capturing", TORCH_FN(stream_capturing));
  register_fused_stats(*libs.back());
  // torch.autocast(device_type="testdev"): PyTorch registers nothing on the
  // autocast key of PrivateUse1 (autocast.cpp).
  libs.push_back(std::make_unique<torch::Library>(
      torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__));
  register_autocast_fallthrough(*libs.back());
  libs.push_back(std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__));
  register_autocast_kernels(*libs.back());

  init_faults_from_env();
  init_costs_from_env();
  fallback_hidden();  // reads TESTDEV_HIDE_FALLBACK now, to report a bad value at load
}

struct Init {
  Init() {
    try {
      register_all();
    } catch (const std::exception& e) {
      // Throwing out of a static initialiser would abort inside dlopen.
      g_init_error = std::string("registration failed: ") + e.what();
      std::fprintf(stderr, "testdev: %s\n", g_init_error.c_str());
    }
  }
};
Init g_init;

}  // namespace
}  // namespace testdev
