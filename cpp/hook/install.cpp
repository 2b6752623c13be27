// Registration: the fallback, the custom ops and nothing else, from one
// guarded function that Rust calls at load. No static registration macro is
// used, because a second copy of the library (loaded from another path) would
// then throw inside a static initializer and terminate the process.

#include <pthread.h>

#include <optional>
#include <string>
#include <vector>

#include <torch/library.h>

#include "opdump/cpp/device/device_stats.h"
#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/hook/parts.h"
#include "opdump/cpp/rows/rows.h"
#include "opdump/cpp/stats/stats.h"
#include "opdump/cpp/opdump.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

namespace {

void op_enable() { control_enable(); }
void op_disable() { control_disable(); }
void op_flush() { control_flush(); }
void op_finish() { control_finish(); }
int64_t op_step() { return control_step(); }
std::vector<int64_t> op_stats() {
  auto v = control_stats();
  return std::vector<int64_t>(v.begin(), v.end());
}
std::vector<int64_t> op_capture_stats() {
  auto v = control_capture_stats();
  return std::vector<int64_t>(v.begin(), v.end());
}
std::vector<int64_t> op_device_stats() {
  auto v = control_device_stats();
  return std::vector<int64_t>(v.begin(), v.end());
}
// Called by the module hooks (python_hooks.cpp).
void op_module_enter(std::string path) { control_module_enter(rust::Str(path)); }
void op_module_exit() { control_module_exit(); }
void op_name_tensors(std::vector<at::Tensor> tensors, std::vector<std::string> names) {
  names_add(tensors, names);
}
// Python's exit begins, or a Library is destroyed (python_hooks.cpp).
void op_python_pause() { python_pause(); }
void op_python_resume() { python_resume(); }
int64_t op_python_reruns() { return python_reruns(); }
// Memory a job allocated again outside the dispatcher (FSDP's
// alloc_storage, python_hooks.cpp): no values until something writes it.
void op_fresh_memory(at::Tensor t) {
  try {
    remember_uninitialized(t);
  } catch (const std::exception& e) {
    warn(rust::Str(std::string("following re-allocated memory failed: ") + e.what()));
  }
}

bool already_registered(c10::Dispatcher& d, std::string& why) {
  if (d.hasBackendFallbackForDispatchKey(kHookKey)) {
    why = std::string("a fallback is already registered on ") + c10::toString(kHookKey);
    return true;
  }
  if (d.findSchema(c10::OperatorName("opdump::enable", ""))) {
    why = "the opdump:: custom ops are already registered";
    return true;
  }
  return false;
}

}  // namespace

bool install() {
  try {
    auto& d = c10::Dispatcher::singleton();
    std::string why;
    if (already_registered(d, why)) {
      internal_error(rust::Str(
          "another copy of opdump is already loaded in this process (" + why +
          "); this copy stays inactive"));
      return false;
    }
    // The Library objects must live as long as the registrations: leaked on
    // purpose, as the static ones of TORCH_LIBRARY would be.
    auto* ops = new torch::Library(torch::Library::DEF, "opdump", std::nullopt, __FILE__, __LINE__);
    ops->def("enable() -> ()", &op_enable);
    ops->def("disable() -> ()", &op_disable);
    ops->def("flush() -> ()", &op_flush);
    ops->def("finish() -> ()", &op_finish);
    ops->def("step() -> int", &op_step);
    ops->def("stats() -> int[]", &op_stats);
    ops->def("device_stats() -> int[]", &op_device_stats);
    ops->def("capture_stats() -> int[]", &op_capture_stats);
    ops->def("module_enter(str path) -> ()", &op_module_enter);
    ops->def("module_exit() -> ()", &op_module_exit);
    ops->def("name_tensors(Tensor[] tensors, str[] names) -> ()", &op_name_tensors);
    ops->def("fresh_memory(Tensor t) -> ()", &op_fresh_memory);
    ops->def("python_pause() -> ()", &op_python_pause);
    ops->def("python_resume() -> ()", &op_python_resume);
    ops->def("python_reruns() -> int", &op_python_reruns);
    register_device_ops(*ops);
    auto* impl = new torch::Library(torch::Library::IMPL, "_", kHookKey, __FILE__, __LINE__);
    watch_op_deregistrations();
    impl->fallback(torch::CppFunction::makeFromBoxedFunction<&hook_fallback>());
    pthread_atfork(&uninitialized_atfork_prepare, &uninitialized_atfork_parent,
                   &uninitialized_atfork_child);
    pthread_atfork(&reuse_atfork_prepare, &reuse_atfork_release, &reuse_atfork_release);
    pthread_atfork(&device_atfork_prepare, &device_atfork_parent, &device_atfork_child);
    return true;
  } catch (const std::exception& e) {
    internal_error(rust::Str(std::string("registration failed: ") + e.what()));
    return false;
  }
}

void set_active(bool on) {
  if (on) {
    thread_hook_enable();
    key_on_for_this_thread();
  } else {
    thread_hook_disable();
    // Writes are no longer seen: nothing may stay held.
    device_close_open();
  }
  const bool passing = on && hook_only();
  g_hook_only.store(passing, std::memory_order_release);
  g_active.store(on, std::memory_order_release);
  python_hooks_want(on && !passing);
}

rust::String torch_version() {
#ifdef TORCH_VERSION
  return rust::String(TORCH_VERSION);
#else
  return rust::String(TORCH_VERSION_AT_BUILD);
#endif
}

}  // namespace opdump
