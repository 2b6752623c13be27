// Copies and in-place restrides of memory without values: which outputs hold
// none (carries.cpp; the memory itself is followed in uninitialized.cpp).
//
// A copy of uninitialized memory holds no values either: `torch.empty(n).to(x)`,
// and the CPU fallback of a backend, which copies every argument to the CPU
// (`_to_cpu`), out= buffers included, and copies the results back. Neither
// does the same memory restrided in place (TensorIterator restrides a fresh
// output with `as_strided_`). What each output becomes is judged from the
// arguments before the op runs: in-place ops move the version counter that
// keys the memory.
#pragma once

#include <cstdint>
#include <exception>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

namespace opdump {

enum class CarryKind : uint8_t {
  None,
  Copy,      // a new tensor (or `self` itself) with the values of the source
  CopyInto,  // writes the values of the source into `dst`
  Restride,  // `self` in place, metadata only
  Resize,    // `self` in place, on new memory where it grows
  Set,       // `self` onto the memory of the source
};

// Whether the op (its name without the namespace) is one of those above;
// asked once per op (fallback.cpp keeps it), so that the others skip judge.
bool may_carry(std::string_view op);

// What one output of such an op is.
enum class Carry : uint8_t {
  Values,    // what the op computed: measured as usual
  Row,       // no values, but forgotten rather than remembered: inside a kernel
             // the memory may be filled without the dispatcher, moving no
             // version (the CPU fallback runs its op into the CPU copies of
             // out= buffers), so only this row is known to hold none
  Remember,  // no values, remembered at its version after the op
  Keep,      // no values; the memory stays remembered as it was (inside a
             // kernel an in-place op moves no version)
};

// The state of a copy's or restride's arguments before it runs, per output
// (the element of a list, or 0).
struct Carries {
  CarryKind kind = CarryKind::None;
  struct Before {
    bool src_uninitialized = false;
    bool dst_uninitialized = false;
    size_t nbytes = 0;  // Resize: the storage's size before
  };
  c10::SmallVector<Before, 4> before;

  // The state before the op runs of what op `op` (base name) copies or
  // restrides; kind None when it holds no memory without values.
  static Carries judge(std::string_view op, const c10::FunctionSchema& schema, const torch::jit::Stack& stack);

  // `out`: the output after the op (element `list_index` of a list, or -1);
  // `versioned`: see RowBuilder::versioned.
  Carry decide(const at::Tensor& out, int32_t list_index, bool versioned) const;
};

// One `internal_error` line for a failure to follow the memory of `op`.
void carry_failed(const c10::OperatorHandle& op, const std::exception& e);
// Remembers or forgets `t` as memory without values, as `c` says.
void apply_carry(Carry c, const at::Tensor& t);

// What an unrecorded call did to memory without values: the same as a
// recorded one, so that what is recorded later does not depend on the
// selection (OPDUMP_INCLUDE, OPDUMP_MAX_DEPTH, steps). `empty`: the output
// is memory without values (`empty*`).
void note_unrecorded_output(const c10::IValue& v, bool produced, bool write, bool empty, const Carries& carries,
                            bool versioned);

}  // namespace opdump
