// Reading an op's arguments off its schema and stack (see call_args.h).

#include "opdump/cpp/rows/call_args.h"

namespace opdump {

bool holds_tensors(const c10::IValue& v) {
  // The tag checks first: most arguments are numbers, and isTensorList()
  // is a call that asks the list's element type.
  if (v.isTensor()) return true;
  if (!v.isList()) return false;
  if (v.isTensorList()) return true;
  for (const auto& e : v.toListRef())
    if (e.isTensor()) return true;
  return false;
}

bool is_tensor_type(const c10::Argument& a) {
  auto kind = a.real_type()->kind();
  if (kind == c10::TypeKind::TensorType) return true;
  if (kind == c10::TypeKind::OptionalType)
    return a.real_type()->expectRef<c10::OptionalType>().getElementType()->kind() ==
           c10::TypeKind::TensorType;
  if (kind == c10::TypeKind::ListType) {
    auto el = a.real_type()->expectRef<c10::ListType>().getElementType();
    if (el->kind() == c10::TypeKind::OptionalType)
      el = el->expectRef<c10::OptionalType>().getElementType();
    return el->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

}  // namespace opdump
