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
// bias gradient) or casts it to its input's dtype, the input buffers add up
// the gradients of a tensor used twice, and final callbacks (queue_callback,
// DDP's) run after the last node. All of it runs while the thread executes a
// graph task, which the engine marks in a thread-local of its own: on the
// calling thread, on the device threads and in reentrant backward alike,
// user hooks included.
//
// Which node that work serves: the engine names the node it evaluates
// (torch::autograd::get_current_node, set around the node's scope, its
// validate_outputs and the accumulation of its outputs into the next
// nodes' input buffers), so that work belongs to the node it just ran. An
// AccumulateGrad node (a leaf's gradient accumulation: `detach`, `add_`)
// was made by no forward call: its work belongs to the module whose
// parameter the leaf is.

#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/function.h>  // Node: in node.h from torch 2.13, in function.h before

#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/hook/parts.h"
#include "opdump/cpp/rows/rows.h"
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

namespace {

// The thread that stands for "accumulation into a parameter" in
// current_backward_node: no forward thread has a negative id. Must equal
// ACCUMULATE_GRAD_THREAD in crates/engine/src/modules.rs.
constexpr int64_t kAccumulateGradThread = -2;

// The module whose parameter `leaf` is, by the parameter's name
// ("h.0.c_attn.bias" → "h.0.c_attn"), as an interned id; -1 for a leaf that
// is no named parameter, or one of the root module itself (the root's path
// is its class, which the name does not tell).
int64_t owner_module_id(const at::Tensor& leaf) noexcept {
  try {
    const rust::String name = tensor_name(leaf);
    const std::string_view path(name.data(), name.size());
    const size_t dot = path.rfind('.');
    if (dot == std::string_view::npos) return -1;
    const uint32_t id = name_id(path.substr(0, dot));
    return id == UINT32_MAX ? -1 : static_cast<int64_t>(id);
  } catch (...) {  // out of memory for the name: the calls carry no module
    return -1;
  }
}

// The owner module of the parameter the AccumulateGrad node `node` serves,
// for the calls it makes (a `detach` or an `add_` each, and their parts): the
// last answer is kept per thread, keyed by the node and its parameter, since
// a new node may take a freed one's address.
int64_t accumulation_owner(torch::autograd::AccumulateGrad& node) {
  thread_local const void* tl_node = nullptr;
  thread_local const void* tl_leaf = nullptr;
  thread_local int64_t tl_owner = -1;
  const void* leaf = node.variable.unsafeGetTensorImpl();
  if (tl_node != &node || tl_leaf != leaf) {
    tl_owner = node.variable.defined() ? owner_module_id(node.variable) : -1;
    tl_node = &node;
    tl_leaf = leaf;
  }
  return tl_owner;
}

}  // namespace

bool current_backward_node(int64_t& thread, int64_t& seq_nr) {
  // The node the engine evaluates covers its own scope and the work the
  // engine does for it after it; a reentrant backward's inner nodes replace
  // it until they are done.
  if (const auto node = torch::autograd::get_current_node()) {
    // AccumulateGrad nodes take the largest sequence number (the engine
    // runs them first), so the other nodes skip the cast.
    auto* acc = node->sequence_nr() == UINT64_MAX
                    ? dynamic_cast<torch::autograd::AccumulateGrad*>(node.get())
                    : nullptr;
    if (acc != nullptr) {
      const int64_t owner = accumulation_owner(*acc);
      if (owner < 0) return false;
      thread = kAccumulateGradThread;
      seq_nr = owner;
      return true;
    }
    thread = static_cast<int64_t>(node->thread_id());
    seq_nr = static_cast<int64_t>(node->sequence_nr());
    return true;
  }
  // A node applied outside the engine: its BACKWARD_FUNCTION scope.
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
