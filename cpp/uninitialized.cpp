// Memory that holds no values yet, followed through views, copies and
// restrides of it.
//
// The outputs of `empty*` are measured as uninitialized, but a job often
// views such memory before it writes it: `nn.Parameter(torch.empty(...))`
// detaches it, and only then does `reset_parameters` fill it. Each
// uninitialized output is remembered by its storage and version counter
// (which views share). Until an op produces values in that storage (a
// non-view output on it, or an in-place write that moves the version), any
// tensor on it is still uninitialized. Keyed on a weak reference, not an
// address alone, since freed addresses are reused.
//
// Copies and in-place restrides of such memory hold no values either
// (fallback.cpp decides which outputs those are). A restride at the top level
// moves the version counter without writing: its output is remembered again
// at the new version. `set_` puts a second tensor, with a counter of its own,
// on the same storage: an entry holds each such family's counter and the
// version it was remembered at, so that a write through any of them (its
// counter moves) means the storage holds values.

#include <mutex>
#include <unordered_map>

#include <c10/util/SmallVector.h>

#include "opdump/cpp/internal.h"

namespace opdump {

namespace {

// The tensors that share one version counter (a tensor and its views), and
// the version they were remembered at. The counter is kept, not only read:
// the storage alone (a `set_` source) has none.
struct Family {
  c10::VariableVersion counter;
  uint32_t version;
};

struct Entry {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  c10::SmallVector<Family, 1> families;
};

constexpr size_t kMaxEntries = 1 << 16;
// Beyond this many tensors set_ onto one storage, the newest one replaces
// them all (the others then count as written: never the other way round).
constexpr size_t kMaxFamilies = 4;

std::mutex g_mutex;
std::unordered_map<const c10::StorageImpl*, Entry> g_entries;
std::atomic<size_t> g_size{0};

bool trackable(const at::Tensor& t) {
  return t.defined() && t.has_storage() && !t.is_inference() && t.layout() == at::kStrided &&
         t.unsafeGetTensorImpl()->version_counter().enabled();
}

// The storage is alive (not a new one at a freed address) and no family
// remembered on it has written since.
bool unwritten(const Entry& e, const c10::StorageImpl* s) {
  auto live = e.storage.lock();
  if (live.get() != s) return false;
  for (const auto& f : e.families)
    if (f.counter.current_version() != f.version) return false;
  return true;
}

void erase(std::unordered_map<const c10::StorageImpl*, Entry>::iterator it) {
  g_entries.erase(it);
  g_size.store(g_entries.size(), std::memory_order_relaxed);
}

}  // namespace

// A fork while another thread holds the lock must not leave it held in the
// child (pthread_atfork, registered at install).
void uninitialized_atfork_prepare() { g_mutex.lock(); }
void uninitialized_atfork_parent() { g_mutex.unlock(); }
void uninitialized_atfork_child() { g_mutex.unlock(); }

bool uninitialized_tracking() { return g_size.load(std::memory_order_relaxed) != 0; }

void remember_uninitialized(const at::Tensor& t) {
  if (!trackable(t)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_entries.size() >= kMaxEntries) {
    std::erase_if(g_entries, [](const auto& kv) { return kv.second.storage.expired(); });
    if (g_entries.size() >= kMaxEntries) g_entries.clear();
  }
  const auto& storage = t.storage();
  const auto* key = storage.unsafeGetStorageImpl();
  Family family{t.unsafeGetTensorImpl()->version_counter(), static_cast<uint32_t>(t._version())};
  auto it = g_entries.find(key);
  if (it != g_entries.end() && unwritten(it->second, key) && it->second.families.size() < kMaxFamilies) {
    // Memory still without values, now seen through another tensor (set_
    // onto it, or the same family once more: the same version is kept once).
    for (const auto& f : it->second.families)
      if (f.version == family.version) return;
    it->second.families.push_back(std::move(family));
    return;
  }
  Entry entry{storage.getWeakStorageImpl(), {}};
  entry.families.push_back(std::move(family));
  g_entries.insert_or_assign(key, std::move(entry));
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
  const auto* key = t.storage().unsafeGetStorageImpl();
  auto it = g_entries.find(key);
  if (it == g_entries.end()) return false;
  if (unwritten(it->second, key)) {
    const auto version = static_cast<uint32_t>(t._version());
    for (const auto& f : it->second.families)
      if (f.version == version) return true;
  }
  // Written since, a new storage at a reused address, or a tensor of a family
  // never remembered here, which may have written it.
  erase(it);
  return false;
}

bool storage_uninitialized(const c10::StorageImpl* s) {
  if (g_size.load(std::memory_order_relaxed) == 0 || s == nullptr) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_entries.find(s);
  if (it == g_entries.end()) return false;
  if (unwritten(it->second, s)) return true;
  erase(it);
  return false;
}

}  // namespace opdump
