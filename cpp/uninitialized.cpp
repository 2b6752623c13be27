// Memory that holds no values yet, followed through the views of it.
//
// The outputs of `empty*` are measured as uninitialized, but a job often
// views such memory before it writes it: `nn.Parameter(torch.empty(...))`
// detaches it, and only then does `reset_parameters` fill it. Each
// uninitialized output is remembered by its storage and version counter
// (which views share). Until an op produces values in that storage (a
// non-view output on it, or an in-place write that moves the version), any
// tensor on it is still uninitialized. Keyed on a weak reference, not an
// address alone, since freed addresses are reused.

#include <mutex>
#include <unordered_map>

#include "opdump/cpp/internal.h"

namespace opdump {

namespace {

struct Entry {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t version;  // as TensorBase::_version() returns it
};

constexpr size_t kMaxEntries = 1 << 16;

std::mutex g_mutex;
std::unordered_map<const c10::StorageImpl*, Entry> g_entries;
std::atomic<size_t> g_size{0};

bool trackable(const at::Tensor& t) {
  return t.defined() && t.has_storage() && !t.is_inference() && t.layout() == at::kStrided;
}

}  // namespace

// A fork while another thread holds the lock must not leave it held in the
// child (pthread_atfork, registered at install).
void uninitialized_atfork_prepare() { g_mutex.lock(); }
void uninitialized_atfork_parent() { g_mutex.unlock(); }
void uninitialized_atfork_child() { g_mutex.unlock(); }

void remember_uninitialized(const at::Tensor& t) {
  if (!trackable(t)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_entries.size() >= kMaxEntries) {
    std::erase_if(g_entries, [](const auto& kv) { return kv.second.storage.expired(); });
    if (g_entries.size() >= kMaxEntries) g_entries.clear();
  }
  const auto& storage = t.storage();
  g_entries.insert_or_assign(storage.unsafeGetStorageImpl(), Entry{storage.getWeakStorageImpl(), t._version()});
  g_size.store(g_entries.size(), std::memory_order_relaxed);
}

void forget_uninitialized(const at::Tensor& t) {
  if (g_size.load(std::memory_order_relaxed) == 0 || !trackable(t)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_entries.erase(t.storage().unsafeGetStorageImpl());
  g_size.store(g_entries.size(), std::memory_order_relaxed);
}

bool still_uninitialized(const at::Tensor& t) {
  if (g_size.load(std::memory_order_relaxed) == 0 || !trackable(t)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_entries.find(t.storage().unsafeGetStorageImpl());
  if (it == g_entries.end()) return false;
  auto live = it->second.storage.lock();
  if (live.get() == t.storage().unsafeGetStorageImpl() && it->second.version == t._version()) return true;
  g_entries.erase(it);  // written since, or a new storage at a reused address
  g_size.store(g_entries.size(), std::memory_order_relaxed);
  return false;
}

}  // namespace opdump
