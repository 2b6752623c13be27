// Which outputs of a copy or restride hold no values (see carries.h).

#include "opdump/cpp/hook/carries.h"

#include "opdump/cpp/common/common.h"
#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/hook/parts.h"

namespace opdump {
namespace {

struct CarrySpec {
  CarryKind kind = CarryKind::None;
  const char* src = nullptr;  // the argument whose memory is copied or taken
  const char* dst = nullptr;  // the argument written, for CopyInto
};

CarrySpec carry_spec(std::string_view op) {
  using K = CarryKind;
  if (op == "copy_" || op == "_foreach_copy_") return {K::CopyInto, "src", "self"};
  if (op == "_copy_from" || op == "_copy_from_and_resize") return {K::CopyInto, "self", "dst"};
  if (op == "_to_copy" || op == "clone" || op == "lift_fresh_copy" || op == "to" || op == "contiguous")
    return {K::Copy, "self", nullptr};
  if (op == "_to_cpu") return {K::Copy, "tensors", nullptr};  // pairwise over the list
  if (op == "as_strided_" || op == "squeeze_" || op == "unsqueeze_" || op == "transpose_" || op == "t_" ||
      op == "swapdims_" || op == "swapaxes_" || op == "detach_")
    return {K::Restride, "self", nullptr};
  if (op == "resize_" || op == "resize_as_" || op == "_resize_output_") return {K::Resize, "self", nullptr};
  if (op == "set_") return {K::Set, "source", nullptr};
  return {};
}

bool covers_storage(const at::Tensor& t) {
  return t.has_storage() && t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
         static_cast<size_t>(t.numel()) * t.itemsize() >= t.storage().nbytes();
}

// set_'s source, before: whether it holds no values. set_() leaves an empty
// storage; set_ to a Storage has no version counter of its own to check.
bool set_source_uninitialized(const c10::IValue* src) {
  if (src == nullptr || src->isNone()) return true;
  if (src->isTensor()) return still_uninitialized(src->toTensor());
  if (src->isStorage()) return storage_uninitialized(src->toStorage().unsafeGetStorageImpl());
  return false;
}

// The state before the op of each tensor of `src` (a Tensor or a list), one
// entry per output; whether any of them makes the op carry memory without
// values.
bool note_sources(const c10::IValue& src, CarryKind kind, c10::SmallVector<Carries::Before, 4>& before) {
  bool any = false;
  for_each_tensor(src, [&](const at::Tensor& t) {
    Carries::Before b;
    b.src_uninitialized = still_uninitialized(t);
    if (kind == CarryKind::Resize && t.has_storage()) b.nbytes = t.storage().nbytes();
    any = any || b.src_uninitialized || kind == CarryKind::Resize;
    before.push_back(b);
  });
  return any;
}

// Whether each tensor a copy writes into (`dst`, pairwise with the sources)
// held no values before it.
void note_destinations(const c10::IValue& dst, c10::SmallVector<Carries::Before, 4>& before) {
  size_t j = 0;
  for_each_tensor(dst, [&](const at::Tensor& t) {
    if (j < before.size()) before[j].dst_uninitialized = still_uninitialized(t);
    ++j;
  });
}

}  // namespace

bool may_carry(std::string_view op) { return carry_spec(op).kind != CarryKind::None; }

Carries Carries::judge(std::string_view op, const c10::FunctionSchema& schema, const torch::jit::Stack& stack) {
  Carries c;
  const CarrySpec spec = carry_spec(op);
  // Without remembered memory only a resize (or set_ to nothing) can
  // start some.
  if (spec.kind == CarryKind::None || (spec.kind != CarryKind::Resize && spec.kind != CarryKind::Set &&
                                       !uninitialized_tracking()))
    return c;
  const size_t first = stack.size() - schema.arguments().size();
  auto arg = [&](const char* name) -> const c10::IValue* {
    if (name == nullptr) return nullptr;
    auto i = schema.argumentIndexWithName(name);
    return i ? &stack[first + *i] : nullptr;
  };
  const c10::IValue* src = arg(spec.src);
  if (src == nullptr && spec.kind == CarryKind::CopyInto) src = arg("other");  // copy_.Tensor
  bool any = false;
  if (spec.kind == CarryKind::Set) {
    any = set_source_uninitialized(src);
    c.before.push_back(Before{any, false, 0});
  } else if (src != nullptr) {
    any = note_sources(*src, spec.kind, c.before);
    if (const c10::IValue* dst = arg(spec.dst); dst != nullptr && spec.kind == CarryKind::CopyInto)
      note_destinations(*dst, c.before);
  }
  if (any) c.kind = spec.kind;
  return c;
}

Carry Carries::decide(const at::Tensor& out, int32_t list_index, bool versioned) const {
  const size_t i = list_index < 0 ? 0 : static_cast<size_t>(list_index);
  if (kind == CarryKind::None || i >= before.size() || !out.defined()) return Carry::Values;
  const Before& b = before[i];
  try {
    switch (kind) {
      case CarryKind::Copy:
        return b.src_uninitialized ? (versioned ? Carry::Remember : Carry::Row) : Carry::Values;
      case CarryKind::CopyInto:
        // Into a part of memory that holds values elsewhere: only this row.
        if (!b.src_uninitialized) return Carry::Values;
        return versioned && (b.dst_uninitialized || covers_storage(out)) ? Carry::Remember : Carry::Row;
      case CarryKind::Restride:
      case CarryKind::Set:
        return b.src_uninitialized ? (versioned ? Carry::Remember : Carry::Keep) : Carry::Values;
      case CarryKind::Resize:
        if (b.src_uninitialized) return versioned ? Carry::Remember : Carry::Keep;
        // All new memory. Inside a kernel that is the kernel's out= buffer
        // (resize_output), which it fills next without the dispatcher.
        if (b.nbytes == 0) return versioned ? Carry::Remember : Carry::Row;
        // Values followed by new memory: neither is true of the whole.
        return out.has_storage() && out.storage().nbytes() > b.nbytes ? Carry::Row : Carry::Values;
      case CarryKind::None:
        break;
    }
  } catch (const std::exception&) {
    // Symbolic or unusual tensors: never remembered on a guess.
    return b.src_uninitialized ? Carry::Row : Carry::Values;
  }
  return Carry::Values;
}

void carry_failed(const c10::OperatorHandle& op, const std::exception& e) {
  internal_error(rust::Str(std::string("following the memory of ") + op.operator_name().name + " failed: " + e.what()));
}

void apply_carry(Carry c, const at::Tensor& t) {
  if (c == Carry::Remember)
    remember_uninitialized(t);
  else if (c == Carry::Row)
    forget_uninitialized(t);
}

void note_unrecorded_output(const c10::IValue& v, bool produced, bool write, bool empty, const Carries& carries,
                            bool versioned) {
  int32_t j = v.isTensor() ? -1 : 0;
  for_each_tensor(v, [&](const at::Tensor& t) {
    const Carry carry = empty ? Carry::Remember : carries.decide(t, j, versioned);
    if (carry != Carry::Values)
      apply_carry(carry, t);
    else if (produced)
      produced_values(t, write);
    ++j;
  });
}

}  // namespace opdump
