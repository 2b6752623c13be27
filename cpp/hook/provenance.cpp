// Which memory a nested call can be trusted to read.
//
// A kernel may allocate its output without the dispatcher (structured
// kernels do) and then call dispatched ops on it before computing it: `mm`
// calls `resolve_conj` on its fresh result, `cat` narrows it. Measured, that
// memory is garbage, different in every run. Within one top-level call, the
// storages opdump has seen (the call's inputs, and the outputs of the calls
// nested in it) are known; a nested call's tensor on any other storage, and
// not computed by that call, is recorded as not measured.

#include <algorithm>
#include <unordered_set>
#include <vector>

#include "opdump/cpp/common/common.h"
#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/hook/parts.h"

namespace opdump {

namespace {
// A top-level call sees a handful of storages: a vector searched linearly,
// cleared without freeing, costs no allocation per call. A call that sees
// many (a foreach over every parameter) moves to a hash set.
constexpr size_t kLinear = 64;

struct Known {
  std::vector<const c10::StorageImpl*> few;
  std::unordered_set<const c10::StorageImpl*> many;
  // A weak reference to each storage above keeps its StorageImpl object
  // (not its memory) allocated until the next top-level call, so no new
  // storage can take the address of one that died within this call and be
  // taken for known: the wrapped scalar a composite kernel makes would
  // otherwise count as known or not depending on the allocator's order.
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> pins;
  bool large = false;
  // The first `args` entries of `few` are the top-level call's arguments.
  size_t args = 0;

  void clear() {
    few.clear();
    if (large) many.clear();
    pins.clear();
    large = false;
    args = 0;
  }
  void insert(c10::StorageImpl* s) {
    if (large) {
      if (many.insert(s).second) pin(s);
    } else if (std::find(few.begin(), few.end(), s) == few.end()) {
      few.push_back(s);
      pin(s);
      if (few.size() > kLinear) {
        many.insert(few.begin(), few.end());
        large = true;
      }
    }
  }
  void pin(c10::StorageImpl* s) {
    pins.emplace_back(c10::weak_intrusive_ptr<c10::StorageImpl>(
        c10::intrusive_ptr<c10::StorageImpl>::unsafe_reclaim_from_nonowning(s)));
  }
  bool contains(const c10::StorageImpl* s) const {
    return large ? many.contains(s) : std::find(few.begin(), few.end(), s) != few.end();
  }
};

thread_local Known tl_known;

c10::StorageImpl* storage_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  return t.storage().unsafeGetStorageImpl();
}
}  // namespace

void provenance_begin_top_level() { tl_known.clear(); }

void provenance_note(const at::Tensor& t) {
  if (auto* s = storage_of(t)) tl_known.insert(s);
}

void provenance_arguments_noted() { tl_known.args = tl_known.large ? 0 : tl_known.few.size(); }

bool provenance_is_argument(const at::Tensor& t) {
  auto* s = storage_of(t);
  const auto end = tl_known.few.begin() + static_cast<std::ptrdiff_t>(tl_known.args);
  return s != nullptr && std::find(tl_known.few.begin(), end, s) != end;
}

bool provenance_known(const at::Tensor& t) {
  auto* s = storage_of(t);
  return s == nullptr || tl_known.contains(s);
}

void provenance_note_all(const c10::IValue& v) { for_each_tensor(v, provenance_note); }

}  // namespace opdump
