// Which threads carry the hook, and which phase a thread is in.
//
// The dispatch key is switched on through the thread-local included set, so
// a thread the job starts later would not be observed. A global
// RecordFunction callback runs at every op of every thread: at a thread's
// first op it switches the key on (that one op is missed). The same callback
// follows the scopes that mark a phase: the autograd engine's backward
// functions (BACKWARD_FUNCTION) and `Optimizer.step`, which torch wraps in a
// record_function scope named "Optimizer.step#<class>.step".

#include <mutex>
#include <optional>
#include <string_view>

#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "opdump/cpp/internal.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

namespace {

thread_local bool tl_key_on = false;
thread_local int tl_backward = 0;
thread_local int tl_optimizer = 0;

std::mutex g_cb_mutex;
std::optional<at::CallbackHandle> g_cb;

// The observer context tells the end callback which scope it closes.
struct ScopeContext : at::ObserverContext {
  explicit ScopeContext(Phase p) : phase(p) {}
  Phase phase;  // Backward or Optimizer
};

constexpr std::string_view kOptimizerStep = "Optimizer.step#";

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!tl_key_on) key_on_for_this_thread();
  switch (fn.scope()) {
    case at::RecordScope::BACKWARD_FUNCTION:
      ++tl_backward;
      return std::make_unique<ScopeContext>(Phase::Backward);
    case at::RecordScope::USER_SCOPE:
      if (std::string_view(fn.name()).starts_with(kOptimizerStep)) {
        ++tl_optimizer;
        return std::make_unique<ScopeContext>(Phase::Optimizer);
      }
      return nullptr;
    default:
      return nullptr;
  }
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  if (static_cast<ScopeContext*>(ctx)->phase == Phase::Backward) {
    if (tl_backward > 0) --tl_backward;
  } else if (tl_optimizer > 0 && --tl_optimizer == 0) {
    optimizer_step_done();
  }
}

}  // namespace

void key_on_for_this_thread() {
  c10::impl::tls_set_dispatch_key_included(kHookKey, true);
  tl_key_on = true;
}

Phase current_phase() {
  if (tl_optimizer > 0) return Phase::Optimizer;
  if (tl_backward > 0) return Phase::Backward;
  return Phase::Forward;
}

void thread_hook_enable() {
  std::lock_guard<std::mutex> lock(g_cb_mutex);
  if (g_cb) {
    at::reenableCallback(*g_cb);
    return;
  }
  g_cb = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                   .needsInputs(false)
                                   .needsOutputs(false)
                                   .needsIds(false));
}

void thread_hook_disable() {
  std::lock_guard<std::mutex> lock(g_cb_mutex);
  if (g_cb) at::disableCallback(*g_cb);
}

}  // namespace opdump
