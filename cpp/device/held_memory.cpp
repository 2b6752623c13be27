// Whether a held tensor's memory is still the memory it was measured in
// (device_hold.cpp holds measured device tensors until their batch closes).
//
// A held alias keeps the StorageImpl alive, not its allocation. FSDP frees
// and re-allocates a parameter's memory between uses with
// `untyped_storage().resize_(0)` and `resize_(n)`, outside the dispatcher:
// the storage is the same object, and the new allocation can come back at
// the same address (a caching allocator hands the freed block out again).
// Neither the size nor the address tells, and reading it would record the
// new memory's contents as the op's output.
//
// Every re-allocation of a storage's memory (resize_bytes on the CPU, CUDA
// and PrivateUse1 alike) asks the storage's own allocator. So while a
// storage is held, its allocator is a WatchingAllocator that hands each
// request to the original one, unchanged, and counts it: a count that moved
// between hold and read means the memory changed owner, and the
// measurement fails. The watch ends at the read and the original
// allocator is put back. A resize to nothing is caught at the read by the
// missing memory, `set_()` and other ops that write it through the
// dispatcher by the read before the write (WriteScope).
//
// Watching allocators are never freed, and one serves only the allocator it
// was made for: a storage made meanwhile from the held one's allocator (a
// lazy clone) keeps a pointer to it, and must keep reaching its device's
// allocator.

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>

#include "opdump/cpp/device/device_batch.h"

namespace opdump {
namespace devstats {

class WatchingAllocator final : public c10::Allocator {
 public:
  explicit WatchingAllocator(c10::Allocator* original) : original_(original) {}

  c10::DataPtr allocate(size_t n) override {
    allocations.fetch_add(1, std::memory_order_relaxed);
    return original_->allocate(n);
  }
  bool is_simple_data_ptr(const c10::DataPtr& p) const override { return original_->is_simple_data_ptr(p); }
  c10::DeleterFnPtr raw_deleter() const override { return original_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    original_->copy_data(dest, src, count);
  }
  c10::Allocator* original() const { return original_; }

  std::atomic<uint64_t> allocations{0};
  c10::StorageImpl* storage = nullptr;  // the storage it watches (g.mutex)
  int64_t watchers = 0;                 // held parts on that storage (g.mutex)

 private:
  c10::Allocator* const original_;
};

namespace {

// Idle watching allocators, by the allocator they serve. g.mutex held.
std::unordered_map<c10::Allocator*, std::vector<WatchingAllocator*>>& idle() {
  static auto* m = new std::unordered_map<c10::Allocator*, std::vector<WatchingAllocator*>>();
  return *m;
}

WatchingAllocator* take(c10::Allocator* original) {
  auto& free = idle()[original];
  if (free.empty()) return new WatchingAllocator(original);  // never freed: see above
  WatchingAllocator* w = free.back();
  free.pop_back();
  return w;
}

const void* address(const c10::StorageImpl* s) {
  return const_cast<c10::StorageImpl*>(s)->_mutable_data_ptr_no_checks().get();
}

}  // namespace

void watch_memory(Batch::Part& part) {
  auto* s = const_cast<c10::StorageImpl*>(part.storage);
  part.held_address = address(s);
  if (!s->resizable() || s->allocator() == nullptr) return;  // no new allocation can come
  auto* w = dynamic_cast<WatchingAllocator*>(s->allocator());
  if (w == nullptr || w->storage != s) {
    // A storage whose allocator is another storage's watch (a lazy clone
    // of it) is watched by one of its own for the same original.
    c10::Allocator* original = w != nullptr ? w->original() : s->allocator();
    w = take(original);
    w->storage = s;
    w->watchers = 0;
    s->set_allocator(w);
  }
  ++w->watchers;
  part.watch = w;
  part.allocations = w->allocations.load(std::memory_order_relaxed);
}

bool memory_changed(const Batch::Part& part) {
  if (address(part.storage) != part.held_address) return true;
  return part.watch != nullptr && part.watch->allocations.load(std::memory_order_relaxed) != part.allocations;
}

void unwatch_memory(Batch::Part& part) {
  WatchingAllocator* w = part.watch;
  part.watch = nullptr;
  if (w == nullptr || --w->watchers > 0) return;
  // The held alias still keeps the storage alive here.
  if (w->storage->allocator() == w) w->storage->set_allocator(w->original());
  w->storage = nullptr;
  idle()[w->original()].push_back(w);
}

}  // namespace devstats
}  // namespace opdump
