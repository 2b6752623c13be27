// Declarations shared by the C++ files; not part of the bridge.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/DispatchKeySet.h>

// The shared structs and enums of the bridge (src/bridge.rs): TensorRow,
// TensorStats, Role, Phase, StatsStatus.
#include "opdump/cpp/device_stats.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

// The one place that names the key opdump's fallback sits on. It is above
// autograd, autocast, Python and functorch, so every op at every nesting depth
// passes through it. TESTING_ONLY_GenericMode is the only free key today.
constexpr c10::DispatchKey kHookKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

// The CPU check of a call named by online compare (cpu_check.cpp): its
// inputs copied to the host before it runs, in float64 and as they are;
// after it ran, its outputs are copied and the check goes on on a thread
// of its own, which hands the result to Rust (cpu_check_done).
struct CpuCheckInputs {
  std::vector<c10::IValue> inputs64, inputs;
};
CpuCheckInputs cpu_check_inputs(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);
void cpu_check_start(CpuCheckInputs&& in, const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);

// The accuracy check (OPDUMP_CHECK, accuracy_check.cpp): a call's
// signature (op, overload, tensor dtypes and shapes, the other arguments'
// text), the bytes of its input tensors, and, after it ran, the check of
// call `id` queued for the checking thread with its outputs copied.
std::string call_signature(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack,
                           std::string_view args_text);
uint64_t input_bytes(const c10::OperatorHandle& op, const std::vector<c10::IValue>& stack);
void accuracy_check_enqueue(int64_t id, CpuCheckInputs&& in, const c10::OperatorHandle& op,
                            const std::vector<c10::IValue>& stack);

// Keys that must not see the ops opdump itself runs to measure a tensor: its
// own, autograd, autocast, user Python modes and functorch.
c10::DispatchKeySet stats_excluded_keys();

// Calls `f(t, j)` with each tensor a value holds and its position: -1 for
// a Tensor, its index for an element of a Tensor[] or Tensor?[] (None
// elements are skipped, their indexes kept).
template <typename F>
void for_each_tensor_indexed(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor(), int64_t{-1});
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    for (size_t j = 0; j < list.size(); ++j) f(list.get(j), static_cast<int64_t>(j));
  } else if (v.isList()) {
    auto list = v.toListRef();
    for (size_t j = 0; j < list.size(); ++j)
      if (list[j].isTensor()) f(list[j].toTensor(), static_cast<int64_t>(j));
  }
}

// Calls `f` with each tensor a value holds: a Tensor, or the tensors of a
// Tensor[] or Tensor?[].
template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  for_each_tensor_indexed(v, [&](const at::Tensor& t, int64_t) { f(t); });
}

// Tensors whose values opdump cannot or must not read (meta, fake, sparse,
// quantized, nested, functorch wrappers, no storage): metadata only
// (stats.cpp).
bool values_unreadable(const at::Tensor& t);

// Whether recording is on. Read at every op; written by set_active.
extern std::atomic<bool> g_active;
// OPDUMP_HOOK_ONLY while active: calls pass through the hook untouched.
extern std::atomic<bool> g_hook_only;

// The boxed fallback (fallback.cpp).
void hook_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);

// The phase of the calling thread (threads.cpp).
// The module hooks (python_hooks.cpp): install them when dumping goes on
// (and OPDUMP_MODULES allows), remove them when it goes off; ask again from
// the hook while torch is still importing. The user-code line of the
// calling thread (OPDUMP_SOURCE), or "".
void python_hooks_want(bool on);
void python_hooks_tick();
std::string python_source();
// A CPU rerun that may run Python: the GIL taken on the calling thread (a
// PyGILState), -1 in a process without Python, -2 while reruns are paused
// (none may start then); given back by python_rerun_leave with what enter
// returned. python_watch_exit has Python's exit and the destruction of a
// torch.library.Library pause them and wait for those under way
// (python_pause, python_resume, python_reruns: python_hooks.cpp).
int python_rerun_enter();
void python_rerun_leave(int state);
void python_watch_exit();
void python_pause();
void python_resume();
int64_t python_reruns();

// Starts a detached thread of opdump's, named `name` (a literal), that
// blocks SIGXFSZ before `body` runs (own_threads.cpp): the only way C++
// starts one.
void start_thread(const char* name, std::function<void()> body);

// Ids of interned names (interned.cpp), as TensorRow and OpCall carry them:
// asked of Rust once per distinct name, then cached. u32::MAX: not had,
// which fails the record.
uint32_t name_id(std::string_view name);
uint32_t dtype_name_id(at::ScalarType t);
uint32_t device_name_id(const at::Device& d);
// "0", "1", ...: the names of returns.
uint32_t return_name_id(size_t r);
struct OpNames {
  std::string name, overload;  // to tell a reused entry from the one cached
  uint32_t op = 0, overload_id = 0;
  std::vector<uint32_t> args;  // by the schema's argument index
};
// The calling thread's cached ids of an op's names.
const OpNames& op_names(const c10::OperatorHandle& op);

// Names of parameters, buffers and their gradients (names.cpp).
void names_add(const std::vector<at::Tensor>& tensors, const std::vector<std::string>& names);
void names_new_optimizer_scope();
rust::String tensor_name(const at::Tensor& t);

// The full tensors and typed arguments of a call OPDUMP_CAPTURE chose
// (saved_call.cpp): inputs before the op runs, outputs (the returns, or for
// an op that returns nothing the arguments it wrote, by name) after.
// `budgeted`: the bytes come from OPDUMP_CAPTURE_MAX_BYTES (the accuracy
// check's captures are bounded by its own cap instead).
void save_inputs(OpCall& call, const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                 bool budgeted = true);
void save_outputs(OpCall& call, const c10::FunctionSchema& schema, const torch::jit::Stack& stack,
                  const std::vector<std::pair<std::string, c10::IValue>>& written, bool budgeted = true);

// The autograd node the calling thread runs in backward: its forward thread
// and sequence number. False outside a node.
bool current_backward_node(int64_t& thread, int64_t& seq_nr);
Phase current_phase();
// Adds (once) or re-enables the RecordFunction callback; disables it.
void thread_hook_enable();
void thread_hook_disable();
// Switches the hook key on for the calling thread.
void key_on_for_this_thread();

// Statistics (stats.cpp). Fills the status and statistics fields of `row`.
// `no_values` is the status given when `values_defined` is false.
// `lookup`: take the statistics from the cache of measured tensors when they
// are there; `remember`: put what is measured into it. Device tensors need
// `later`: their row may wait for its statistics, and then `later->result`
// says for what.
void measure(const at::Tensor& t, bool values_defined, TensorRow& row,
             StatsStatus no_values = StatsStatus::Uninitialized,
             bool lookup = false, bool remember = false, Later* later = nullptr);

// The fingerprint and sketch of a contiguous CPU tensor into `row`
// (signature_cpu.cpp), for a sketch of length `k` (0: the fingerprint only).
// Leaves them unset for a tensor it cannot read as it is (not contiguous,
// with a conj or neg bit, an unknown dtype).
void measure_signature_cpu(const at::Tensor& x, int k, TensorRow& row);
// OPDUMP_SKETCH, read once: the sketch's length, 0 for neither (stats.cpp).
int sketch_size_once();

// The cache of measured tensors (reuse.cpp). An entry holds statistics, or
// the device result they will come from (`pending`), each element repeated
// `repeat` times.
// `pending_signature`: whether `pending` also brings the tensor's fingerprint
// and sketch (not for a view that reorders the elements).
void reuse_remember(const at::Tensor& t, const TensorRow& row, DeviceResultPtr pending = nullptr,
                    int64_t repeat = 1, bool pending_signature = true);
// Fills row.stats (and the signature), or sets `pending`, `repeat` and
// `pending_signature` when the statistics are still on their way.
bool reuse_lookup(const at::Tensor& t, TensorRow& row, DeviceResultPtr& pending, int64_t& repeat,
                  bool& pending_signature);
// The written arguments of the innermost call from above autograd (see
// reuse.cpp).
void reuse_begin_call();
void reuse_note_written(const c10::IValue& v);
bool reuse_written_by_current_call(const at::Tensor& t);
void reuse_atfork_prepare();
void reuse_atfork_release();

// Uninitialized memory followed through views, copies and restrides
// (uninitialized.cpp).
void remember_uninitialized(const at::Tensor& t);
bool still_uninitialized(const at::Tensor& t);
void forget_uninitialized(const at::Tensor& t);
// An op produced `t`, as a new output or by writing it (`write`: in place,
// out=); whether it holds values now. A write makes its own bytes values,
// the rest of the storage as before (a slice of an `empty` buffer); a new
// output holds none where it spans memory of which only parts were
// written (a buffer returned after ops filled a part of it).
bool produced_values(const at::Tensor& t, bool write);
// A storage on which no remembered tensor has written (a `set_` source).
bool storage_uninitialized(const c10::StorageImpl* s);
// Whether any memory is remembered at all (the cheap test before a lookup).
bool uninitialized_tracking();
void uninitialized_atfork_prepare();
void uninitialized_atfork_parent();
void uninitialized_atfork_child();

// Memory a nested call can be trusted to read (provenance.cpp).
void provenance_begin_top_level();
void provenance_note(const at::Tensor& t);
void provenance_note_all(const c10::IValue& v);
bool provenance_known(const at::Tensor& t);
// After the top-level call's arguments are noted: whether `t` is on the
// storage of one of them (memory that existed before the call).
void provenance_arguments_noted();
bool provenance_is_argument(const at::Tensor& t);

}  // namespace opdump
