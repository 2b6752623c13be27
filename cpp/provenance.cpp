// Which memory a nested call can be trusted to read.
//
// A kernel may allocate its output without the dispatcher (structured
// kernels do) and then call dispatched ops on it before computing it: `mm`
// calls `resolve_conj` on its fresh result, `cat` narrows it. Measured, that
// memory is garbage, different in every run. Within one top-level call, the
// storages opdump has seen (the call's inputs, and the outputs of the calls
// nested in it) are known; a nested call's tensor on any other storage, and
// not computed by that call, is recorded as not measured.

#include <unordered_set>

#include "opdump/cpp/internal.h"

namespace opdump {

namespace {
thread_local std::unordered_set<const c10::StorageImpl*> tl_known;

const c10::StorageImpl* storage_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  return t.storage().unsafeGetStorageImpl();
}
}  // namespace

void provenance_begin_top_level() { tl_known.clear(); }

void provenance_note(const at::Tensor& t) {
  if (auto* s = storage_of(t)) tl_known.insert(s);
}

bool provenance_known(const at::Tensor& t) {
  auto* s = storage_of(t);
  return s == nullptr || tl_known.contains(s);
}

void provenance_note_all(const c10::IValue& v) {
  if (v.isTensor()) {
    provenance_note(v.toTensor());
  } else if (v.isTensorList()) {
    for (const auto& t : v.toTensorList()) provenance_note(t);
  } else if (v.isList()) {
    for (const auto& e : v.toListRef())
      if (e.isTensor()) provenance_note(e.toTensor());
  }
}

}  // namespace opdump
