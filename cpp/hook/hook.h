// What the hook (the dispatcher fallback, its installation, the threads and
// the Python hooks it follows, and the memory it tracks across calls) offers
// the other folders. Declarations the files of hook/ share only among
// themselves are in hook/parts.h. The device path and the signature never
// include this folder's headers (tests/test_layout.py).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>

#include "opdump/src/bridge.rs.h"

namespace opdump {

// The one place that names the key opdump's fallback sits on. It is above
// autograd, autocast, Python and functorch, so every op at every nesting depth
// passes through it. TESTING_ONLY_GenericMode is the only free key today.
constexpr c10::DispatchKey kHookKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

// A CPU rerun that may run Python: the GIL taken on the calling thread (a
// PyGILState), -1 in a process without Python, -2 while reruns are paused
// (none may start then); given back by python_rerun_leave with what enter
// returned. python_watch_exit has Python's exit and the destruction of a
// torch.library.Library pause them and wait for those under way
// (python_pause, python_resume, python_reruns in hook/parts.h:
// python_hooks.cpp).
int python_rerun_enter();
void python_rerun_leave(int state);
void python_watch_exit();

// Uninitialized memory followed through views, copies and restrides
// (uninitialized.cpp; the rest of it in hook/parts.h).
void remember_uninitialized(const at::Tensor& t);
bool still_uninitialized(const at::Tensor& t);
// An op produced `t`, as a new output or by writing it (`write`: in place,
// out=); whether it holds values now. A write makes its own bytes values,
// the rest of the storage as before (a slice of an `empty` buffer); a new
// output holds none where it spans memory of which only parts were
// written (a buffer returned after ops filled a part of it).
bool produced_values(const at::Tensor& t, bool write);

// Memory a nested call can be trusted to read (provenance.cpp; the rest of
// it in hook/parts.h).
void provenance_note(const at::Tensor& t);
bool provenance_known(const at::Tensor& t);
// After the top-level call's arguments are noted: whether `t` is on the
// storage of one of them (memory that existed before the call).
bool provenance_is_argument(const at::Tensor& t);

}  // namespace opdump
