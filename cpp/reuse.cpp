// Statistics already measured, reused instead of reading the data again.
//
// An op's input is very often the unmodified output of an op just recorded
// (a layer's activation, a weight read by forward and backward). Only
// top-level calls use the cache (see fallback.cpp). The cache
// keys each measured tensor on a weak reference to its TensorImpl and its
// version counter, not on an address, since freed addresses are reused; any
// in-place write through the dispatcher moves the version and invalidates the
// entry. Inference tensors have no version counter and are never cached.
// Writes that bypass the dispatcher (a NumPy view, a data_ptr kernel) do not
// move the version: OPDUMP_REUSE=0 switches the shortcuts off.

#include <mutex>
#include <unordered_map>

#include "opdump/cpp/internal.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

namespace {

struct Cached {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl;
  uint32_t version;
  double min, max, mean, std, l2, absmax;
  int64_t nan, posinf, neginf, zero;
};

constexpr size_t kMaxEntries = 1 << 15;

std::mutex g_mutex;
std::unordered_map<const c10::TensorImpl*, Cached> g_cache;

bool cacheable(const at::Tensor& t) {
  return t.defined() && !t.is_inference() && t.layout() == at::kStrided;
}

}  // namespace

void reuse_remember(const at::Tensor& t, const TensorRow& row) {
  if (!cacheable(t)) return;
  Cached c{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()), t._version(), row.min, row.max, row.mean, row.std, row.l2, row.absmax,
           row.nan_count, row.posinf_count, row.neginf_count, row.zero_count};
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_cache.size() >= kMaxEntries) {
    std::erase_if(g_cache, [](const auto& kv) { return kv.second.impl.expired(); });
    if (g_cache.size() >= kMaxEntries) g_cache.clear();
  }
  g_cache.insert_or_assign(t.unsafeGetTensorImpl(), std::move(c));
}

bool reuse_lookup(const at::Tensor& t, TensorRow& row) {
  if (!cacheable(t)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_cache.find(t.unsafeGetTensorImpl());
  if (it == g_cache.end()) return false;
  const Cached& c = it->second;
  auto live = c.impl.lock();
  if (live.get() != t.unsafeGetTensorImpl() || c.version != t._version()) {
    g_cache.erase(it);  // written since, or a new tensor at a reused address
    return false;
  }
  row.min = c.min;
  row.max = c.max;
  row.mean = c.mean;
  row.std = c.std;
  row.l2 = c.l2;
  row.absmax = c.absmax;
  row.nan_count = c.nan;
  row.posinf_count = c.posinf;
  row.neginf_count = c.neginf;
  row.zero_count = c.zero;
  return true;
}

void reuse_atfork_prepare() { g_mutex.lock(); }
void reuse_atfork_release() { g_mutex.unlock(); }

}  // namespace opdump
