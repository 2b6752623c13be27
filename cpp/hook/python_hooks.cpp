// The module hooks: which nn.Module runs each call, with no change to the
// job (README.md, "Where in the model").
//
// How they get in. The plugin is loaded into a Python process, but must not
// need one (a C++ job loads torch too), so it links no libpython: the few
// functions of the Python C API it uses are looked up at run time among the
// symbols the process has. When dumping is switched on (and OPDUMP_MODULES
// is not 0), opdump asks the interpreter, with Py_AddPendingCall, to run
// `apply(want)` of a small module of its own (kHooksSource, compiled into
// `_opdump_module_hooks`) on the main thread at its next safe point: with
// the GIL held, never inside a dispatcher call, never at dlopen time. That
// registers two global module hooks, `register_module_forward_pre_hook` and
// `register_module_forward_hook(always_call=True)`, which cover every module,
// those made later included. While torch is still being imported, `apply`
// does nothing and says so; the next recorded op asks again. Switching
// dumping off removes the hooks the same way.
//
// What they cost. Loaded but never switched on: nothing (no hook, no
// pending call; the hook fallback's one atomic check below). On: Python
// calls torch.ops.opdump.module_enter/module_exit around every module's
// forward, and name_tensors once per root model. module_enter and
// module_exit are builtin functions of ours (module_enter_fn below), made
// with the C API, not torch.ops calls through the dispatcher: a few tens of
// nanoseconds a module call, not several microseconds, and a path is
// interned once, not at every call.
//
// With OPDUMP_SOURCE=1 the same module's `source()` names the innermost line
// of user code for each top-level call: the GIL is taken on the job's thread
// for it (torch releases it around an op).

#include <dlfcn.h>

#include <sys/types.h>

#include <atomic>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "opdump/cpp/hook/hook.h"
#include "opdump/cpp/hook/parts.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

namespace {

// The module's source. `apply(want)` installs or removes the hooks and
// returns whether that is done; `source()` returns the caller's user-code
// line, or "".
constexpr const char* kHooksSource = R"PY(
import functools
import os
import sys
import threading
import warnings
import weakref

_handles = []
# module_enter(path) and module_exit(): builtin functions the plugin sets
# here (python_hooks.cpp) before apply() runs; torch.ops.opdump's otherwise.
_c_enter = _c_exit = None
_local = threading.local()
# id(module) -> (a weak reference to it, its qualified path). Looked up at
# every module call: a WeakKeyDictionary would make a weak reference for
# each lookup.
_paths = {}
_torch_dir = None


def _ready():
    t = sys.modules.get("torch")
    if t is None or getattr(getattr(t, "__spec__", None), "_initializing", False):
        return False
    return "torch.nn.modules.module" in sys.modules


def _known_path(mod):
    e = _paths.get(id(mod))
    return e[1] if e is not None and e[0]() is mod else None


def _set_path(mod, path):
    # torch.compile's wrapper is never looked up by itself (see pre): left
    # out, it cannot give its path to the calls of its compiled code.
    if _is_compiled(mod):
        return
    key = id(mod)

    def gone(ref, key=key):
        e = _paths.get(key)
        if e is not None and e[0] is ref:
            del _paths[key]

    _paths[key] = (weakref.ref(mod, gone), path)


def _name_subtree(mod, prefix, name_tensors):
    # named_modules() names the subtree as a job sees it; tied modules and
    # parameters keep their first name.
    for path, sub in mod.named_modules(prefix=prefix):
        if path and _known_path(sub) is None:
            _set_path(sub, path)
    tensors = list(mod.named_parameters(prefix=prefix)) + list(mod.named_buffers(prefix=prefix))
    if tensors:
        name_tensors([t for _, t in tensors], [n for n, _ in tensors])


def _path_of(mod, parent, name_tensors):
    path = _known_path(mod)
    if path is not None:
        return path
    if parent is None:
        # Called by the job itself: a root, named by its class, its
        # submodules by their paths below it.
        path = type(mod).__name__
        _set_path(mod, path)
        _name_subtree(mod, "", name_tensors)
        return path
    # Made after its root was named, or a model called inside another: its
    # place in the module that calls it.
    pmod, ppath, proot = parent
    attr = next((k for k, v in pmod._modules.items() if v is mod), None) or type(mod).__name__
    path = attr if proot else ppath + "." + attr
    _set_path(mod, path)
    _name_subtree(mod, path, name_tensors)
    return path


def _is_compiled(mod):
    # OptimizedModule, the wrapper torch.compile(module) returns; looked up
    # by name first so that a job that never compiles imports nothing.
    if type(mod).__name__ != "OptimizedModule":
        return False
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(mod, eval_frame.OptimizedModule)


_FORK_EXIT_FLAG = "__opdump_finishes__"
_fork_exit_watched = False


def _finish_before_exit():
    # In a forked child: its records reach files only when the writer
    # completes them at exit, and multiprocessing's workers (DataLoader)
    # end with os._exit after their loop, which runs no exit handler.
    real_exit = os._exit
    if getattr(real_exit, _FORK_EXIT_FLAG, False):
        return  # a child of a child: already wrapped

    def _exit(status):
        try:
            sys.modules["torch"].ops.opdump.finish()
        except BaseException:
            pass
        real_exit(status)

    functools.update_wrapper(_exit, real_exit)
    setattr(_exit, _FORK_EXIT_FLAG, True)
    os._exit = _exit


def _watch_fork_exit():
    global _fork_exit_watched
    if not _fork_exit_watched:
        os.register_at_fork(after_in_child=_finish_before_exit)
        _fork_exit_watched = True


_FSDP_FLAG = "__opdump_fresh_memory__"
_FSDP_MODULES = (
    "torch.distributed.fsdp._fully_shard._fsdp_param",
    "torch.distributed.fsdp._fully_shard._fsdp_param_group",
)
_fsdp_done = False


def _follow_fsdp_storage(compiling):
    # FSDP2 allocates an unsharded parameter's memory again before each
    # all-gather with untyped_storage().resize_(n), which no op shows, and
    # views it before the all-gather's copy-out fills it: until then it
    # holds whatever the allocator handed out. opdump is told, so that those
    # views are `uninitialized`, not garbage recorded as `computed`. Under
    # Dynamo the wrapper adds nothing to the graph (compiling() is constant
    # there).
    global _fsdp_done
    mod = sys.modules.get(_FSDP_MODULES[0])
    if mod is None:
        return
    _fsdp_done = True
    real = getattr(mod, "alloc_storage", None)
    if real is None or getattr(real, _FSDP_FLAG, False):
        return
    fresh = sys.modules["torch"].ops.opdump.fresh_memory

    def alloc_storage(tensor):
        real(tensor)
        if not compiling():
            fresh(tensor)

    functools.update_wrapper(alloc_storage, real)
    setattr(alloc_storage, _FSDP_FLAG, True)
    for name in _FSDP_MODULES:
        m = sys.modules.get(name)
        if m is not None and getattr(m, "alloc_storage", None) is real:
            m.alloc_storage = alloc_storage


def _pause_reruns(seconds):
    # opdump's CPU reruns of ops that may run Python (every op outside
    # aten:: and prims::) start no more, and those under way finish, for at
    # most `seconds`; sleeping gives them the GIL, which their kernels take
    # back after each torch call.
    sys.modules["torch"].ops.opdump.python_pause()
    _wait_reruns(seconds)


def _wait_reruns(seconds):
    import time

    ops = sys.modules["torch"].ops.opdump
    deadline = time.monotonic() + seconds
    while ops.python_reruns() > 0 and time.monotonic() < deadline:
        time.sleep(0.002)


def watch_exit():
    # Two moments when a rerun of a custom op must not be under way:
    # - Python's exit, before its threads can no longer take the GIL: a
    #   rerun that took it back after that would be ended inside a
    #   destructor and abort the process;
    # - a torch.library.Library being destroyed (_scoped_library, a
    #   fixture): its ops' kernels and schemas are freed, under a rerun that
    #   may be running them (the GIL is released inside their torch calls).
    import atexit
    import weakref

    atexit.register(_pause_reruns, 10)
    tl = sys.modules["torch"].library
    # A Library goes through _destroy (_scoped_library) or, when dropped,
    # through the finalizer it registered with _del_library.
    real_destroy, real_del = tl.Library._destroy, tl._del_library
    if getattr(real_destroy, "__opdump_pauses__", False):
        return

    def paused(real):
        def removes(*args):
            # Resumed whenever it was paused, even if the wait failed.
            ops, paused = sys.modules["torch"].ops.opdump, False
            try:
                ops.python_pause()
                paused = True
                _wait_reruns(10)
            except BaseException:
                pass
            try:
                return real(*args)
            finally:
                if paused:
                    ops.python_resume()

        functools.update_wrapper(removes, real)
        removes.__opdump_pauses__ = True
        return removes

    tl.Library._destroy = paused(real_destroy)
    tl._del_library = paused(real_del)
    for info in list(weakref.finalize._registry.values()):
        if getattr(info, "func", None) is real_del:
            info.func = tl._del_library


# want: 1, the module hooks; 2, forked children complete their files at
# os._exit (OPDUMP_FORK=record). A fork hook cannot be removed; in a child
# it only completes what was recorded.
def apply(want):
    if want & 2:
        _watch_fork_exit()
    if not want & 1:
        for h in _handles:
            h.remove()
        _handles.clear()
        return True
    if _handles:
        return True
    if not _ready():
        return False
    import torch
    from torch.nn.modules import module as nn_module

    global _torch_dir
    _torch_dir = os.path.dirname(torch.__file__) + os.sep
    ops = torch.ops.opdump
    enter, leave, name_tensors = ops.module_enter, ops.module_exit, ops.name_tensors
    if _c_enter is not None and _c_exit is not None:
        enter, leave = _c_enter, _c_exit
    # While Dynamo traces a module call it inlines these hooks: returning at
    # once leaves nothing in the graph and mutates nothing it tracks. The
    # compiled code then runs without them, so the calls it makes cannot be
    # told apart by module: they carry none (see pre), never a wrong one.
    compiling = torch.compiler.is_compiling

    def pre(mod, args):
        if compiling():
            return
        if not _fsdp_done:
            _follow_fsdp_storage(compiling)
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        parent = stack[-1] if stack else None
        if parent is not None and parent[1] == "":
            path = ""  # inside compiled code, or the compiled module itself
        else:
            path = _known_path(mod)
            if path is not None:
                pass  # every call after a module's first
            elif _is_compiled(mod):
                # torch.compile's wrapper: its module and the tensors are
                # named as in an eager run, but the calls of its compiled
                # code carry no module ("").
                _path_of(mod._orig_mod, parent, name_tensors)
                path = ""
            else:
                path = _path_of(mod, parent, name_tensors)
        stack.append((mod, path, parent is None))
        enter(path)

    def post(mod, args, out):
        if compiling():
            return
        stack = getattr(_local, "stack", None)
        if stack and stack[-1][0] is mod:
            stack.pop()
            leave()

    # torch.compile(module) warns on every compiled model that global hooks
    # fire an extra time for its wrapper: these hooks expect that (pre), and
    # the job's output must not change because opdump is on.
    warnings.filterwarnings(
        "ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks", category=UserWarning
    )
    _handles.append(nn_module.register_module_forward_pre_hook(pre))
    _handles.append(nn_module.register_module_forward_hook(post, always_call=True))
    return True


def source():
    f = sys._getframe(0).f_back
    here = sys._getframe(0).f_code.co_filename
    while f is not None:
        name = f.f_code.co_filename
        if name != here and not (_torch_dir and name.startswith(_torch_dir)) and not name.startswith("<frozen"):
            try:
                shown = os.path.relpath(name)
                if shown.startswith(".."):
                    shown = name
            except ValueError:
                shown = name
            return f"{shown}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return ""
)PY";

// The functions of the C API opdump calls, found in the process.
struct PyApi {
  int (*is_initialized)() = nullptr;
  int (*gil_ensure)() = nullptr;  // PyGILState_STATE is an int-sized enum
  void (*gil_release)(int) = nullptr;
  void* (*this_thread_state)() = nullptr;
  int (*add_pending_call)(int (*)(void*), void*) = nullptr;
  void* (*compile_string)(const char*, const char*, int) = nullptr;
  void* (*exec_code_module)(const char*, void*) = nullptr;
  void* (*get_attr)(void*, const char*) = nullptr;
  void* (*call_one_arg)(void*, void*) = nullptr;
  void* (*call_no_args)(void*) = nullptr;
  int (*is_true)(void*) = nullptr;
  const char* (*as_utf8)(void*) = nullptr;
  void* (*long_from_long)(long) = nullptr;
  void (*dec_ref)(void*) = nullptr;
  void (*err_clear)() = nullptr;
  // For the builtin functions module_enter and module_exit; without them
  // the hooks call torch.ops.opdump's.
  void* (*new_function)(void*, void*, void*) = nullptr;  // PyCFunction_NewEx
  int (*set_attr)(void*, const char*, void*) = nullptr;
  const char* (*as_utf8_and_size)(void*, ssize_t*) = nullptr;
  void (*inc_ref)(void*) = nullptr;
  void* none = nullptr;  // Py_None

  bool complete() const {
    return is_initialized && gil_ensure && gil_release && this_thread_state && add_pending_call && compile_string &&
           exec_code_module && get_attr && call_one_arg && call_no_args && is_true && as_utf8 && long_from_long && dec_ref && err_clear;
  }
  bool functions() const { return new_function && set_attr && as_utf8_and_size && inc_ref && none; }
};

template <typename F>
void find(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

const PyApi* python() {
  static const PyApi* api = []() -> const PyApi* {
    static PyApi a;
    find(a.is_initialized, "Py_IsInitialized");
    find(a.gil_ensure, "PyGILState_Ensure");
    find(a.gil_release, "PyGILState_Release");
    find(a.this_thread_state, "PyGILState_GetThisThreadState");
    find(a.add_pending_call, "Py_AddPendingCall");
    find(a.compile_string, "Py_CompileString");
    find(a.exec_code_module, "PyImport_ExecCodeModule");
    find(a.get_attr, "PyObject_GetAttrString");
    find(a.call_one_arg, "PyObject_CallOneArg");
    find(a.call_no_args, "PyObject_CallNoArgs");
    find(a.is_true, "PyObject_IsTrue");
    find(a.as_utf8, "PyUnicode_AsUTF8");
    find(a.long_from_long, "PyLong_FromLong");
    find(a.dec_ref, "Py_DecRef");
    find(a.err_clear, "PyErr_Clear");
    find(a.new_function, "PyCFunction_NewEx");
    find(a.set_attr, "PyObject_SetAttrString");
    find(a.as_utf8_and_size, "PyUnicode_AsUTF8AndSize");
    find(a.inc_ref, "Py_IncRef");
    a.none = dlsym(RTLD_DEFAULT, "_Py_NoneStruct");
    return a.complete() ? &a : nullptr;  // not a Python process (or < 3.9)
  }();
  return api;
}

constexpr int kPyFileInput = 257;  // Py_file_input
// The module's file name in tracebacks and frames (source() skips it).
constexpr const char* kHooksFile = "<opdump module hooks>";

// What apply() is to install (its `want`): 1, the module hooks (dumping is
// on and OPDUMP_MODULES is 1); 2, forked children complete their files at
// os._exit (dumping is on and OPDUMP_FORK=record).
constexpr int kWantModules = 1;
constexpr int kWantForkExit = 2;
std::atomic<int> g_want{0};
std::atomic<bool> g_applied{false};  // the hooks are as g_want says
std::atomic<bool> g_scheduled{false};
std::atomic<bool> g_broken{false};  // apply failed: no more tries
// _opdump_module_hooks, a reference kept for good. Set under the GIL.
std::atomic<void*> g_module{nullptr};

// The id of a module's path (intern_name; u32::MAX for "", a module whose
// calls carry none), kept per path object: the hooks pass the same str
// object at each call of a module. A str freed and another made at its
// address is told apart by its text. GIL held.
uint32_t module_path_id(void* str, std::string_view path) {
  struct Seen {
    std::string path;
    uint32_t id;
  };
  static std::unordered_map<const void*, Seen> seen;
  auto it = seen.find(str);
  if (it != seen.end() && it->second.path == path) return it->second.id;
  const uint32_t id = path.empty() ? UINT32_MAX : intern_name(rust::Str(path.data(), path.size()));
  if (seen.size() > 65536) seen.clear();  // many models made and freed
  seen.insert_or_assign(str, Seen{std::string(path), id});
  return id;
}

// module_enter(path): METH_O. Never raises into the job: a path that is no
// str (never from the hooks) enters a module whose calls carry none.
void* module_enter_fn(void*, void* arg) {
  const PyApi* py = python();
  ssize_t n = 0;
  const char* s = py->as_utf8_and_size(arg, &n);
  uint32_t id = UINT32_MAX;
  if (s == nullptr) {
    py->err_clear();
  } else {
    try {
      id = module_path_id(arg, std::string_view(s, static_cast<size_t>(n)));
    } catch (...) {  // out of memory for the cache: the calls carry no module
    }
  }
  control_module_enter_id(id);
  py->inc_ref(py->none);
  return py->none;
}

// module_exit(): METH_NOARGS.
void* module_exit_fn(void*, void*) {
  const PyApi* py = python();
  control_module_exit();
  py->inc_ref(py->none);
  return py->none;
}

// PyMethodDef, as the C API lays it out.
struct MethodDef {
  const char* name;
  void* (*meth)(void*, void*);
  int flags;
  const char* doc;
};
constexpr int kMethNoArgs = 0x0004;  // METH_NOARGS
constexpr int kMethO = 0x0008;       // METH_O
MethodDef g_enter_def{"module_enter", &module_enter_fn, kMethO, nullptr};
MethodDef g_exit_def{"module_exit", &module_exit_fn, kMethNoArgs, nullptr};

// Sets `_c_enter` and `_c_exit` of the module; where that fails, the hooks
// call torch.ops.opdump's (slower, the same columns).
void add_functions(const PyApi& py, void* m) {
  if (!py.functions()) return;
  for (auto [def, attr] : {std::pair{&g_enter_def, "_c_enter"}, std::pair{&g_exit_def, "_c_exit"}}) {
    void* fn = py.new_function(def, nullptr, nullptr);
    if (fn == nullptr || py.set_attr(m, attr, fn) != 0) py.err_clear();
    if (fn != nullptr) py.dec_ref(fn);
  }
}

// The module, compiled and imported the first time (GIL held).
void* hooks_module(const PyApi& py) {
  if (void* m = g_module.load()) return m;
  void* code = py.compile_string(kHooksSource, kHooksFile, kPyFileInput);
  if (code == nullptr) return nullptr;
  void* m = py.exec_code_module("_opdump_module_hooks", code);
  py.dec_ref(code);
  if (m != nullptr) add_functions(py, m);
  g_module.store(m);
  return m;
}

// `fn(arg)` (or `fn()` when `arg` is null) of the module `mod`: a new
// reference to its result, or null with Python's error set. GIL held.
void* call_hooks(const PyApi& py, void* mod, const char* fn_name, void* arg) {
  void* fn = mod != nullptr ? py.get_attr(mod, fn_name) : nullptr;
  if (fn == nullptr) return nullptr;
  void* out = arg != nullptr ? py.call_one_arg(fn, arg) : py.call_no_args(fn);
  py.dec_ref(fn);
  return out;
}

// Runs on the main thread with the GIL held (Py_AddPendingCall).
int apply_pending(void*) {
  const PyApi* py = python();
  g_scheduled.store(false);
  const int want = g_want.load();
  void* mod = hooks_module(*py);
  void* arg = mod != nullptr ? py->long_from_long(want) : nullptr;
  void* done = arg != nullptr ? call_hooks(*py, mod, "apply", arg) : nullptr;
  const int ok = done != nullptr ? py->is_true(done) : -1;
  for (void* o : {done, arg})
    if (o != nullptr) py->dec_ref(o);
  if (ok < 0) {
    py->err_clear();  // the job's own error state stays as it was: clean
    g_broken.store(true);
    warn(rust::Str("the module hooks could not be installed; the module and name columns stay empty"));
    return 0;
  }
  // Not yet (torch is still importing): the next recorded op asks again.
  if (ok == 1 && want == g_want.load()) g_applied.store(true);
  return 0;
}

void schedule() {
  const PyApi* py = python();
  if (py == nullptr || g_broken.load(std::memory_order_relaxed) || !py->is_initialized()) return;
  if (g_scheduled.exchange(true)) return;
  if (py->add_pending_call(&apply_pending, nullptr) != 0) g_scheduled.store(false);
}

}  // namespace

void python_hooks_want(bool on) {
  const int want = on ? (modules_enabled() ? kWantModules : 0) | (fork_record_enabled() ? kWantForkExit : 0) : 0;
  if (want == g_want.load() && g_applied.load()) return;
  g_want.store(want);
  g_applied.store(false);
  // Never installed and not wanted: nothing to remove, no Python to run.
  if (want || g_module.load() != nullptr) schedule();
}

void python_hooks_tick() {
  if (!g_applied.load(std::memory_order_relaxed) && g_want.load(std::memory_order_relaxed)) schedule();
}

std::string python_source() {
  const PyApi* py = python();
  void* mod = g_module.load();
  if (py == nullptr || !py->is_initialized() || mod == nullptr) return {};
  // A thread Python has never run on has no line of user code; taking the
  // GIL there could also wait on a thread that waits on it.
  if (py->this_thread_state() == nullptr) return {};
  const int gil = py->gil_ensure();
  std::string out;
  void* s = call_hooks(*py, mod, "source", nullptr);
  const char* text = s != nullptr ? py->as_utf8(s) : nullptr;
  if (text != nullptr) out = text;
  if (s != nullptr) py->dec_ref(s);
  if (text == nullptr) py->err_clear();
  py->gil_release(gil);
  return out;
}

namespace {

std::atomic<int64_t> g_paused{0};        // reruns may not start (watch_exit)
std::atomic<int64_t> g_reruns{0};        // reruns holding or taking the GIL
std::atomic<bool> g_exit_watched{false};

int watch_exit_pending(void*) {
  const PyApi* py = python();
  void* done = call_hooks(*py, hooks_module(*py), "watch_exit", nullptr);
  if (done != nullptr)
    py->dec_ref(done);
  else
    py->err_clear();  // the job's error state stays clean
  return 0;
}

}  // namespace

void python_watch_exit() {
  const PyApi* py = python();
  if (py == nullptr || !py->is_initialized() || g_exit_watched.exchange(true)) return;
  if (py->add_pending_call(&watch_exit_pending, nullptr) != 0) g_exit_watched.store(false);
}

int python_rerun_enter() {
  const PyApi* py = python();
  if (py == nullptr || !py->is_initialized()) return -1;
  g_reruns.fetch_add(1);
  if (g_paused.load() > 0) {
    g_reruns.fetch_sub(1);
    return -2;
  }
  return py->gil_ensure();
}

void python_rerun_leave(int state) {
  if (const PyApi* py = python(); py != nullptr && state >= 0) py->gil_release(state);
  if (state != -1) g_reruns.fetch_sub(1);
}

void python_pause() { g_paused.fetch_add(1); }
void python_resume() { g_paused.fetch_sub(1); }
int64_t python_reruns() { return g_reruns.load(); }

}  // namespace opdump
