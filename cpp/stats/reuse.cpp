// Statistics already measured, reused instead of reading the data again.
//
// An op's input is very often the unmodified output of an op just recorded
// (a layer's activation, a weight read by forward and backward). The cache
// keys each measured tensor on a weak reference to its TensorImpl and its
// version counter, not on an address, since freed addresses are reused; any
// in-place write through the dispatcher above ADInplaceOrView moves the
// version and invalidates the entry. Inference tensors have no version
// counter and are never cached.
//
// The version does not see every write: `p.data` is another TensorImpl on
// the same storage with a version counter of its own, so
// `p.data.normal_()` (how Hugging Face initialises its weights) leaves p's
// version where it was, and `p.data = q` swaps p's storage under the same
// version. So an entry also remembers its storage, and a call from above
// autograd that writes an argument drops every entry on that storage.
//
// Only calls made from above autograd (the user's program, composite ops)
// fill the cache: below it, a kernel writes without moving versions, through
// nested calls or directly. Calls inside a kernel still read the cache, for
// memory other than what the kernel's own call writes (its in-place and out=
// arguments), since a kernel only writes those and memory it allocated.
// Writes that break these rules (a NumPy view, a data_ptr kernel, a kernel
// writing an argument its schema marks read-only) do not move the version:
// OPDUMP_REUSE=0 switches the shortcuts off.

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "opdump/cpp/common/common.h"
#include "opdump/cpp/device/device_stats.h"
#include "opdump/cpp/stats/parts.h"
#include "opdump/cpp/stats/stats.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

namespace {

struct Cached {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl;
  int64_t version;  // as TensorBase::_version() returns it
  const c10::StorageImpl* storage;  // where its values were when measured
  TensorStats stats;
  SignatureValues signature;  // with the statistics, when measured
  DeviceResultPtr pending;  // statistics still on their way from a device
  int64_t repeat;
  bool pending_signature;  // whether `pending` also brings this tensor's signature
};

constexpr size_t kMaxEntries = 1 << 15;
// Entries of tensors freed since are dropped whenever the cache has doubled
// since the last sweep (and has at least this many), not only at
// kMaxEntries: a cache full of dead entries makes every lookup and every
// write's forget_storage a walk through memory larger than the caches.
constexpr size_t kFirstSweep = 256;

std::mutex g_mutex;
std::unordered_map<const c10::TensorImpl*, Cached> g_cache;
// The entries on each storage, for the writes the version does not see.
std::unordered_map<const c10::StorageImpl*, c10::SmallVector<const c10::TensorImpl*, 2>> g_by_storage;
// Whether g_by_storage holds anything: a write with nothing cached (no op
// selected, OPDUMP_REUSE=0) takes no lock.
std::atomic<bool> g_any{false};
size_t g_sweep_at = kFirstSweep;  // with g_mutex held

const c10::StorageImpl* storage_of(const at::Tensor& t) {
  return t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
}

// With g_mutex held.
void unindex(const c10::TensorImpl* impl, const c10::StorageImpl* storage) {
  auto it = g_by_storage.find(storage);
  if (it == g_by_storage.end()) return;
  auto& impls = it->second;
  impls.erase(std::remove(impls.begin(), impls.end(), impl), impls.end());
  if (impls.empty()) g_by_storage.erase(it);
}

// With g_mutex held.
void erase_entry(std::unordered_map<const c10::TensorImpl*, Cached>::iterator it) {
  unindex(it->first, it->second.storage);
  g_cache.erase(it);
}

// With g_mutex held: drops the entries on the storage `t` is written
// through.
void forget_storage(const at::Tensor& t) {
  auto it = g_by_storage.find(storage_of(t));
  if (it == g_by_storage.end()) return;
  for (const c10::TensorImpl* impl : it->second) g_cache.erase(impl);
  g_by_storage.erase(it);
}

// Below this many elements, measuring again costs less than a lookup (a
// lock, a hash, a weak reference) and a remembered entry.
constexpr int64_t kMinElements = 1024;

bool cacheable(const at::Tensor& t) {
  return t.defined() && !t.is_inference() && t.layout() == at::kStrided && t.numel() >= kMinElements;
}

// The storages the innermost call from above autograd on this thread may
// write: its arguments marked as written (in-place and out=). Its kernel
// writes them with nested calls that do not move the version (the version
// moves when the call returns), so a call inside it must not take their
// statistics from the cache.
thread_local std::vector<const c10::StorageImpl*> tl_written;

void note_written(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return;
  tl_written.push_back(t.storage().unsafeGetStorageImpl());
  if (!g_any.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  forget_storage(t);
}

}  // namespace

void reuse_begin_call() { tl_written.clear(); }

void reuse_note_written(const c10::IValue& v) { for_each_tensor(v, note_written); }

bool reuse_written_by_current_call(const at::Tensor& t) {
  if (tl_written.empty()) return false;
  if (!t.has_storage()) return true;
  return std::find(tl_written.begin(), tl_written.end(), t.storage().unsafeGetStorageImpl()) != tl_written.end();
}

void reuse_remember(const at::Tensor& t, const TensorRow& row, DeviceResultPtr pending, int64_t repeat,
                    bool pending_signature) {
  if (!cacheable(t)) return;
  const c10::StorageImpl* storage = storage_of(t);
  Cached c{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()),
           t._version(),
           storage,
           row.stats,
           signature_of_row(row),
           std::move(pending),
           repeat,
           pending_signature};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_cache.size() >= g_sweep_at) {
    for (auto it = g_cache.begin(); it != g_cache.end();) {
      auto next = std::next(it);
      if (it->second.impl.expired()) erase_entry(it);
      it = next;
    }
    if (g_cache.size() >= kMaxEntries) {
      g_cache.clear();
      g_by_storage.clear();
    }
    g_sweep_at = std::max(kFirstSweep, 2 * g_cache.size());
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  auto [it, fresh] = g_cache.try_emplace(impl, std::move(c));
  if (!fresh) {
    unindex(impl, it->second.storage);
    it->second = std::move(c);
  }
  g_by_storage[storage].push_back(impl);
  g_any.store(true, std::memory_order_relaxed);
}

bool reuse_lookup(const at::Tensor& t, TensorRow& row, DeviceResultPtr& pending, int64_t& repeat,
                  bool& pending_signature) {
  if (!cacheable(t)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_cache.find(t.unsafeGetTensorImpl());
  if (it == g_cache.end()) return false;
  // The entry is `t`'s own: its weak reference keeps the TensorImpl
  // object's memory allocated, so no new tensor can take the address while
  // it exists (and locking it would cost two atomic operations a lookup).
  const Cached& c = it->second;
  if (c.version != t._version() || c.storage != storage_of(t)) {
    erase_entry(it);  // written since, or given other memory
    return false;
  }
  row.stats = c.stats;
  if (c.signature.has) put_signature(c.signature, row);
  pending = c.pending;
  repeat = c.repeat;
  pending_signature = c.pending_signature;
  return true;
}

void reuse_atfork_prepare() { g_mutex.lock(); }
void reuse_atfork_release() { g_mutex.unlock(); }

}  // namespace opdump
