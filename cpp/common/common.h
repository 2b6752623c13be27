// What every folder of cpp/ uses and that belongs to none: walking the
// tensors of a value, and starting a thread of opdump's. Depends on no other
// folder.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>

namespace opdump {

// Calls `f(t, j)` with each tensor a value holds and its position: -1 for
// a Tensor, its index for an element of a Tensor[] or Tensor?[] (None
// elements are skipped, their indexes kept).
template <typename F>
void for_each_tensor_indexed(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor(), int64_t{-1});
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    for (size_t j = 0; j < list.size(); ++j) f(list.get(j), static_cast<int64_t>(j));
  } else if (v.isList()) {
    auto list = v.toListRef();
    for (size_t j = 0; j < list.size(); ++j)
      if (list[j].isTensor()) f(list[j].toTensor(), static_cast<int64_t>(j));
  }
}

// Calls `f` with each tensor a value holds: a Tensor, or the tensors of a
// Tensor[] or Tensor?[].
template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  for_each_tensor_indexed(v, [&](const at::Tensor& t, int64_t) { f(t); });
}

// Starts a detached thread of opdump's, named `name` (a literal), that
// blocks SIGXFSZ before `body` runs (own_threads.cpp): the only way C++
// starts one.
void start_thread(const char* name, std::function<void()> body);

}  // namespace opdump
