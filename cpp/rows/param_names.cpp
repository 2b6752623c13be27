// The names of the tensors a model owns: parameters and buffers, by their
// qualified names, and their gradients (`.grad` appended).
//
// The module hooks (python_hooks.cpp) hand over each model's parameters and
// buffers once, when its root module first runs (torch.ops.opdump
// .name_tensors). An entry holds a weak reference to the tensor, so a freed
// one never names a new tensor at its address. Gradients are not handed
// over: `.grad` is a new tensor at every step (zero_grad sets it to None). A
// tensor that is no parameter is looked up among the gradients of the named
// parameters, collected again at most once per optimizer scope (threads.cpp
// counts them), which is where the optimizer reads them.

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "opdump/cpp/rows/rows.h"

namespace opdump {

namespace {

struct Named {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> tensor;
  std::string name;
};
using Map = std::unordered_map<const c10::TensorImpl*, Named>;

std::mutex g_mutex;
Map g_params;  // parameters and buffers
Map g_grads;   // their gradients, as of g_grads_scope
int64_t g_grads_scope = -1;
std::atomic<bool> g_any{false};
std::atomic<int64_t> g_scope{0};

constexpr size_t kMaxNames = 1 << 20;

Named named(const at::Tensor& t, std::string name) {
  return {c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()), std::move(name)};
}

// The entry found is `t`'s own: its weak reference keeps the TensorImpl
// object's memory allocated (c10 frees it with the last weak reference), so
// no other tensor can be at its address while the entry exists, and `t` is
// alive. Locking the reference to check would cost two atomic operations a
// tensor.
const std::string* lookup(const Map& m, const at::Tensor& t) {
  auto it = m.find(t.unsafeGetTensorImpl());
  return it == m.end() ? nullptr : &it->second.name;
}

// The gradients of the named parameters now (g_mutex held).
void collect_grads() {
  g_grads.clear();
  for (auto& [impl, p] : g_params) {
    auto strong = p.tensor.lock();
    if (!strong) continue;
    const at::Tensor param(std::move(strong));
    const at::Tensor& g = param.grad();
    if (g.defined()) g_grads.emplace(g.unsafeGetTensorImpl(), named(g, p.name + ".grad"));
  }
}

}  // namespace

void names_add(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_params.size() + tensors.size() > kMaxNames)
    std::erase_if(g_params, [](const auto& kv) { return kv.second.tensor.expired(); });
  for (size_t i = 0; i < tensors.size() && i < names.size(); ++i) {
    if (!tensors[i].defined() || g_params.size() >= kMaxNames) continue;
    // The first name a tensor gets stays (a tied weight keeps its first).
    g_params.try_emplace(tensors[i].unsafeGetTensorImpl(), named(tensors[i], names[i]));
  }
  g_grads_scope = -1;
  g_any.store(!g_params.empty(), std::memory_order_relaxed);
}

void names_new_optimizer_scope() { g_scope.fetch_add(1, std::memory_order_relaxed); }

rust::String tensor_name(const at::Tensor& t) {
  if (!g_any.load(std::memory_order_relaxed) || !t.defined()) return {};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (const std::string* n = lookup(g_params, t)) return rust::String(*n);
  const int64_t scope = g_scope.load(std::memory_order_relaxed);
  if (g_grads_scope != scope) {
    collect_grads();
    g_grads_scope = scope;
  }
  if (const std::string* n = lookup(g_grads, t)) return rust::String(*n);
  return {};
}

}  // namespace opdump
