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
//
// Unless the write is one the dispatcher shows, into a part of the memory
// (written_in_part): FSDP's all_gather_copy_in makes its all-gather buffer
// with `empty` and copies this rank's shard into one slice of it, the rest
// staying without values until the collective fills it. Such a write adds
// its bytes to the entry's written spans and the families are remembered at
// their new versions; a tensor wholly inside the spans holds values, any
// other is still uninitialized, until the spans cover the storage or a write
// the dispatcher does not show moves a version.

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include <c10/util/SmallVector.h>

#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/hook/parts.h"

namespace opdump {

namespace {

// The tensors that share one version counter (a tensor and its views), and
// the version they were remembered at. The counter is kept, not only read:
// the storage alone (a `set_` source) has none.
struct Family {
  c10::VariableVersion counter;
  uint32_t version;
};

// Bytes [begin, end) of a storage.
struct Span {
  int64_t begin, end;
};

struct Entry {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  c10::SmallVector<Family, 1> families;
  c10::SmallVector<Span, 2> written;  // sorted, disjoint, not touching
};

// Beyond this many separate written spans, the storage counts as written.
constexpr size_t kMaxSpans = 64;

constexpr size_t kMaxEntries = 1 << 16;
// Entries of storages freed since are dropped whenever the map has doubled
// since the last sweep (and has at least this many): a job that makes
// `empty` memory and frees it without a write the dispatcher shows would
// otherwise fill the map to kMaxEntries, and every produced tensor would
// look its storage up in a table larger than the caches (11,712 entries
// after a few seconds of GPT-2 `generate`).
constexpr size_t kFirstSweep = 256;
// Beyond this many tensors set_ onto one storage, the newest one replaces
// them all (the others then count as written: never the other way round).
constexpr size_t kMaxFamilies = 4;

std::mutex g_mutex;
std::unordered_map<const c10::StorageImpl*, Entry> g_entries;
std::atomic<size_t> g_size{0};
size_t g_sweep_at = kFirstSweep;  // with g_mutex held

bool trackable(const at::Tensor& t) {
  return t.defined() && t.has_storage() && !t.is_inference() && t.layout() == at::kStrided &&
         t.unsafeGetTensorImpl()->version_counter().enabled();
}

// No family remembered on the storage has written since. The entry found
// under a live tensor's storage is that storage's own: the entry's weak
// reference keeps the StorageImpl object's memory allocated (c10 frees it
// with the last weak reference), so no new storage can take the address
// while the entry exists.
bool unwritten(const Entry& e) {
  for (const auto& f : e.families)
    if (f.counter.current_version() != f.version) return false;
  return true;
}

void erase(std::unordered_map<const c10::StorageImpl*, Entry>::iterator it) {
  g_entries.erase(it);
  g_size.store(g_entries.size(), std::memory_order_relaxed);
}

// The bytes `t` may touch: from its first element to past its last.
Span span_of(const at::Tensor& t) {
  const auto item = static_cast<int64_t>(t.itemsize());
  const int64_t first = t.storage_offset() * item;
  if (t.numel() == 0) return Span{first, first};
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return Span{first, (last + 1) * item};
}

bool within(const Entry& e, const Span& s) {
  for (const auto& w : e.written)
    if (w.begin <= s.begin && s.end <= w.end) return true;
  return false;
}

// Adds `s` to the written spans; true when they now cover `nbytes` (or are
// too many to follow).
bool add_written(Entry& e, Span s, int64_t nbytes) {
  c10::SmallVector<Span, 2> merged;
  for (const auto& w : e.written) {
    if (w.end < s.begin || s.end < w.begin) {
      merged.push_back(w);
    } else {
      s.begin = std::min(s.begin, w.begin);
      s.end = std::max(s.end, w.end);
    }
  }
  merged.push_back(s);
  std::sort(merged.begin(), merged.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  e.written = std::move(merged);
  return e.written.size() > kMaxSpans || (e.written.size() == 1 && e.written[0].begin <= 0 && e.written[0].end >= nbytes);
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
  if (g_entries.size() >= g_sweep_at) {
    std::erase_if(g_entries, [](const auto& kv) { return kv.second.storage.expired(); });
    if (g_entries.size() >= kMaxEntries) g_entries.clear();
    g_sweep_at = std::max(kFirstSweep, 2 * g_entries.size());
  }
  const auto& storage = t.storage();
  const auto* key = storage.unsafeGetStorageImpl();
  Family family{t.unsafeGetTensorImpl()->version_counter(), static_cast<uint32_t>(t._version())};
  auto it = g_entries.find(key);
  if (it != g_entries.end() && unwritten(it->second) && it->second.families.size() < kMaxFamilies) {
    // Memory still without values, now seen through another tensor (set_
    // onto it, or the same family once more: the same version is kept once).
    for (const auto& f : it->second.families)
      if (f.version == family.version) return;
    it->second.families.push_back(std::move(family));
    return;
  }
  Entry entry{storage.getWeakStorageImpl(), {}, {}};
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

namespace {

// Where `t` lies in a storage of which only parts were written: wholly
// inside them, or beyond them. No: its storage is not such a one.
enum class PartWritten { No, Inside, Beyond };

void written_in_part(const at::Tensor& t) {
  if (g_size.load(std::memory_order_relaxed) == 0 || !trackable(t)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto* key = t.storage().unsafeGetStorageImpl();
  auto it = g_entries.find(key);
  if (it == g_entries.end()) return;
  Entry& e = it->second;
  // This write moved the writer's version by one; a family moved further,
  // and the storage holds values (the entry is this storage's own: see
  // unwritten).
  bool only_this = true;
  for (const auto& f : e.families) {
    const auto now = static_cast<uint32_t>(f.counter.current_version());
    only_this = only_this && (now == f.version || now == f.version + 1);
  }
  if (!only_this || add_written(e, span_of(t), static_cast<int64_t>(key->nbytes()))) {
    erase(it);
    return;
  }
  for (auto& f : e.families) f.version = static_cast<uint32_t>(f.counter.current_version());
}

PartWritten part_written(const at::Tensor& t) {
  if (g_size.load(std::memory_order_relaxed) == 0 || !trackable(t)) return PartWritten::No;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto* key = t.storage().unsafeGetStorageImpl();
  auto it = g_entries.find(key);
  if (it == g_entries.end() || it->second.written.empty()) return PartWritten::No;
  if (!unwritten(it->second)) {
    erase(it);
    return PartWritten::No;
  }
  return within(it->second, span_of(t)) ? PartWritten::Inside : PartWritten::Beyond;
}

}  // namespace

bool produced_values(const at::Tensor& t, bool write) {
  if (write) {
    written_in_part(t);
    return true;
  }
  switch (part_written(t)) {
    case PartWritten::Beyond:
      return false;
    case PartWritten::Inside:
      return true;
    case PartWritten::No:
      break;
  }
  forget_uninitialized(t);
  return true;
}

bool still_uninitialized(const at::Tensor& t) {
  if (g_size.load(std::memory_order_relaxed) == 0 || !trackable(t)) return false;
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto* key = t.storage().unsafeGetStorageImpl();
  auto it = g_entries.find(key);
  if (it == g_entries.end()) return false;
  if (unwritten(it->second)) {
    // Written in part: the views a kernel makes below autograd have
    // counters of their own, so the bytes decide, not the version.
    if (!it->second.written.empty()) return !within(it->second, span_of(t));
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
  if (unwritten(it->second)) return true;
  erase(it);
  return false;
}

}  // namespace opdump
