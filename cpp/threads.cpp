// Which threads carry the hook, and which phase a thread is in.
//
// The dispatch key is switched on through the thread-local included set, so
// a thread the job starts later would not be observed. A global
// RecordFunction callback runs at every op of every thread: at a thread's
// first op it switches the key on (that one op is missed). The same callback
// follows the scopes that mark a phase: the autograd engine's backward
// functions (BACKWARD_FUNCTION), and `Optimizer.step` and
// `Optimizer.zero_grad`, which torch wraps in record_function scopes named
// "Optimizer.step#<class>.step" and "Optimizer.zero_grad#<class>.zero_grad".
//
// A node's own scope does not cover all that the engine runs for it:
// validate_outputs reduces a gradient to its input's shape (`sum_to` of a
// bias gradient), the input buffers add up the gradients of a tensor used
// twice, and final callbacks (queue_callback, DDP's) run after the last node.
// All of it runs while the thread executes a graph task, which the engine
// marks in a thread-local of its own: on the calling thread, on the device
// threads and in reentrant backward alike, user hooks included.

#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/graph_task.h>

#include "opdump/cpp/internal.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

namespace {

thread_local bool tl_key_on = false;
thread_local int tl_backward = 0;
// The autograd nodes this thread is running, innermost last: each one's
// forward thread (RecordFunction's numbering) and sequence number, which
// its forward op call left (fallback.cpp, op_made_nodes).
struct RunningNode {
  int64_t thread;
  int64_t seq_nr;
};
thread_local std::vector<RunningNode> tl_nodes;
thread_local int tl_optimizer_step = 0;
thread_local int tl_zero_grad = 0;

std::mutex g_cb_mutex;
std::optional<at::CallbackHandle> g_cb;

// The observer context tells the end callback which scope it closes.
enum class Scope { Backward, OptimizerStep, ZeroGrad };
struct ScopeContext : at::ObserverContext {
  explicit ScopeContext(Scope s) : scope(s) {}
  Scope scope;
};

constexpr std::string_view kOptimizerStep = "Optimizer.step#";
// zero_grad belongs to the optimizer, but does not end a step.
constexpr std::string_view kZeroGrad = "Optimizer.zero_grad#";

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!tl_key_on) key_on_for_this_thread();
  switch (fn.scope()) {
    case at::RecordScope::BACKWARD_FUNCTION:
      ++tl_backward;
      tl_nodes.push_back({static_cast<int64_t>(fn.forwardThreadId()), fn.seqNr()});
      return std::make_unique<ScopeContext>(Scope::Backward);
    case at::RecordScope::USER_SCOPE: {
      const std::string_view name(fn.name());
      if (name.starts_with(kOptimizerStep) || name.starts_with(kZeroGrad)) names_new_optimizer_scope();
      if (name.starts_with(kOptimizerStep)) {
        ++tl_optimizer_step;
        return std::make_unique<ScopeContext>(Scope::OptimizerStep);
      }
      if (name.starts_with(kZeroGrad)) {
        ++tl_zero_grad;
        return std::make_unique<ScopeContext>(Scope::ZeroGrad);
      }
      return nullptr;
    }
    default:
      return nullptr;
  }
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  switch (static_cast<ScopeContext*>(ctx)->scope) {
    case Scope::Backward:
      if (tl_backward > 0) --tl_backward;
      if (!tl_nodes.empty()) tl_nodes.pop_back();
      break;
    case Scope::OptimizerStep:
      if (tl_optimizer_step > 0 && --tl_optimizer_step == 0) optimizer_step_done();
      break;
    case Scope::ZeroGrad:
      if (tl_zero_grad > 0) --tl_zero_grad;
      break;
  }
}

}  // namespace

void key_on_for_this_thread() {
  c10::impl::tls_set_dispatch_key_included(kHookKey, true);
  tl_key_on = true;
}

Phase current_phase() {
  // An optimizer stepped from a backward hook (optimizer in backward) is the
  // optimizer's work.
  if (tl_optimizer_step > 0 || tl_zero_grad > 0) return Phase::Optimizer;
  if (tl_backward > 0 || torch::autograd::get_current_graph_task_id() != -1) return Phase::Backward;
  return Phase::Forward;
}

bool current_backward_node(int64_t& thread, int64_t& seq_nr) {
  if (tl_nodes.empty()) return false;
  thread = tl_nodes.back().thread;
  seq_nr = tl_nodes.back().seq_nr;
  return true;
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
