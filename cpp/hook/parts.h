// Declarations the files of hook/ share only among themselves; what other
// folders use is in hook/hook.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>

#include "opdump/cpp/hook/hook.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

// Whether recording is on. Read at every op; written by set_active.
extern std::atomic<bool> g_active;
// OPDUMP_HOOK_ONLY while active: calls pass through the hook untouched.
extern std::atomic<bool> g_hook_only;

// The boxed fallback (fallback.cpp).
void hook_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);
// Keeps hook_fallback's per-op cache right when the dispatcher drops an op
// (another may be registered at its address); once, at registration.
void watch_op_deregistrations();

// The module hooks (python_hooks.cpp): install them when dumping goes on
// (and OPDUMP_MODULES allows), remove them when it goes off; ask again from
// the hook while torch is still importing. The user-code line of the
// calling thread (OPDUMP_SOURCE), or "".
void python_hooks_want(bool on);
void python_hooks_tick();
std::string python_source();
// Pause the CPU reruns that may run Python, resume them, and how many run
// now (see python_rerun_enter in hook/hook.h).
void python_pause();
void python_resume();
int64_t python_reruns();

// The phase of the calling thread (threads.cpp).
// The autograd node the calling thread runs in backward: its forward thread
// and sequence number. False outside a node.
bool current_backward_node(int64_t& thread, int64_t& seq_nr);
Phase current_phase();
// Adds (once) or re-enables the RecordFunction callback; disables it.
void thread_hook_enable();
void thread_hook_disable();
// Switches the hook key on for the calling thread.
void key_on_for_this_thread();

// Uninitialized memory (uninitialized.cpp; what other folders use is in
// hook/hook.h).
void forget_uninitialized(const at::Tensor& t);
// A storage on which no remembered tensor has written (a `set_` source).
bool storage_uninitialized(const c10::StorageImpl* s);
// Whether any memory is remembered at all (the cheap test before a lookup).
bool uninitialized_tracking();
void uninitialized_atfork_prepare();
void uninitialized_atfork_parent();
void uninitialized_atfork_child();

// Memory a nested call can be trusted to read (provenance.cpp; what other
// folders use is in hook/hook.h).
void provenance_begin_top_level();
void provenance_note_all(const c10::IValue& v);
// The top-level call's arguments are noted (see provenance_is_argument).
void provenance_arguments_noted();

}  // namespace opdump
