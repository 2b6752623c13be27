// Whether the current stream of a device is capturing a graph (CUDA graphs,
// torch.compile's "reduce-overhead"), when opdump must launch nothing.
//
// opdump asks through an op of its own, opdump::stream_capturing(Tensor t)
// -> bool, dispatched on the backend of `t`:
// - every backend that registers nothing (the CPU among them): false, from
//   the CompositeExplicitAutograd kernel;
// - CUDA: cudaStreamIsCapturing on the current stream. libopdump links no
//   CUDA library, so that one build serves the CPU and the CUDA wheels of
//   torch: both functions it needs are looked up at run time in the
//   libraries torch has loaded (the CUDA runtime, and c10_cuda for the
//   handle of torch's current stream). Where they cannot be found opdump says
//   so once and treats the stream as not capturing;
// - any other backend (an NPU, the test device) registers its own kernel for
//   opdump::stream_capturing on its dispatch key. The dispatcher accepts that
//   kernel before opdump is loaded, so the backend need not know the order.

#include <dlfcn.h>

#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "opdump/cpp/device/device_stats.h"
#include "opdump/cpp/common/common.h"

namespace opdump {

namespace {

bool not_capturing(const at::Tensor&) { return false; }

// The CUDA runtime's functions, found among the libraries already loaded.
struct CudaRuntime {
  // cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus*)
  int (*is_capturing)(void*, int*) = nullptr;
  // cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode*)
  int (*exchange_mode)(int*) = nullptr;
  // c10::cuda::CUDAStream::stream() const: the raw handle of a stream.
  // CUDAStream holds one c10::Stream and nothing else, so a c10::Stream is
  // passed as `this`.
  void* (*raw_stream)(const void*) = nullptr;
};

void* find_loaded(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (void* h = dlopen(n, RTLD_NOW | RTLD_NOLOAD)) return h;
  return nullptr;
}

const CudaRuntime& cuda_runtime() {
  static const CudaRuntime rt = [] {
    CudaRuntime r;
    void* cudart = find_loaded({"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"});
    void* c10_cuda = find_loaded({"libc10_cuda.so"});
    auto sym = [](void* h, const char* name) { return h ? dlsym(h, name) : dlsym(RTLD_DEFAULT, name); };
    r.is_capturing = reinterpret_cast<int (*)(void*, int*)>(sym(cudart, "cudaStreamIsCapturing"));
    r.exchange_mode = reinterpret_cast<int (*)(int*)>(sym(cudart, "cudaThreadExchangeStreamCaptureMode"));
    r.raw_stream = reinterpret_cast<void* (*)(const void*)>(sym(c10_cuda, "_ZNK3c104cuda10CUDAStream6streamEv"));
    return r;
  }();
  return rt;
}

bool cuda_stream_capturing(const at::Tensor& t) {
  const CudaRuntime& rt = cuda_runtime();
  if (rt.is_capturing == nullptr || rt.raw_stream == nullptr) {
    static const bool said = [] {
      warn(rust::Str("cannot find cudaStreamIsCapturing or torch's CUDA stream handle; CUDA graph captures "
                     "are not detected, so do not dump inside one"));
      return true;
    }();
    (void)said;
    return false;
  }
  const c10::Stream s = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device());
  int status = 0;
  // An error: assume a capture, which only costs the measurement.
  if (rt.is_capturing(rt.raw_stream(&s), &status) != 0) return true;
  return status != 0;  // cudaStreamCaptureStatusNone is 0
}

}  // namespace

void register_capture_ops(torch::Library& ops) {
  ops.def("stream_capturing(Tensor t) -> bool");
  // Leaked on purpose, as the static libraries of TORCH_LIBRARY_IMPL would be.
  auto* fallback = new torch::Library(torch::Library::IMPL, "opdump", c10::DispatchKey::CompositeExplicitAutograd,
                                      __FILE__, __LINE__);
  fallback->impl("stream_capturing", TORCH_FN(not_capturing));
  auto* cuda = new torch::Library(torch::Library::IMPL, "opdump", c10::DispatchKey::CUDA, __FILE__, __LINE__);
  cuda->impl("stream_capturing", TORCH_FN(cuda_stream_capturing));
}

bool stream_capturing(const at::Tensor& t) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("opdump::stream_capturing", "")
                             .typed<bool(const at::Tensor&)>();
  return op.call(t);
}

void relax_capture_mode_for_this_thread() {
  const CudaRuntime& rt = cuda_runtime();
  if (rt.exchange_mode == nullptr) return;
  int relaxed = 2;  // cudaStreamCaptureModeRelaxed
  rt.exchange_mode(&relaxed);
}

}  // namespace opdump
