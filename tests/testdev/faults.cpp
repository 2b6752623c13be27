// Planted faults and the boxed CPU fallback of the testdev backend.
//
// TESTDEV_FAULT grammar (README.md has examples):
//   spec  := fault (';' fault)*              empty entries and blanks ignored
//   fault := OP '=' kind
//   OP    := [namespace '::'] name           namespace defaults to aten; no
//                                            overload: a fault covers them all
//   kind  := 'scale:' F                      y = x * F
//          | 'noise:' R [':' SEED]           y = x * (1 + R*u), u ~ U[-sqrt3, sqrt3]
//          | 'permute' [':' SEED]            y = a seeded shuffle of x's elements
//
// `gelu` and `gelu_` name the same fault: the in-place variant of an op (name
// ending in one `_`) is covered by the fault on the op.

#include "faults.h"

#include "counters.h"
#include "device.h"

#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_copy_from_and_resize.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace testdev {

enum class Kind { Scale, Noise, Permute };

// Outside the anonymous namespace: faults.h names it for direct.cpp.
struct Fault {
  std::string op;  // normalised: "aten::gelu"
  Kind kind = Kind::Scale;
  double value = 1.0;  // F for scale, R for noise
  uint64_t seed = 0;
  bool has_seed = false;
  std::atomic<int64_t> count{0};

  std::string describe() const {
    char buf[64];
    switch (kind) {
      case Kind::Scale:
        std::snprintf(buf, sizeof buf, "scale:%.17g", value);
        return op + "=" + buf;
      case Kind::Noise:
        std::snprintf(buf, sizeof buf, "noise:%.17g:%llu", value,
                      static_cast<unsigned long long>(seed));
        return op + "=" + buf;
      case Kind::Permute:
        std::snprintf(buf, sizeof buf, "permute:%llu",
                      static_cast<unsigned long long>(seed));
        return op + "=" + buf;
    }
    return op;
  }
};

namespace {

struct Config {
  std::vector<std::unique_ptr<Fault>> faults;  // in spec order
  std::unordered_map<std::string, Fault*> by_op;
};

// Process-wide state, built on first use: testdev.cpp's static initialiser
// may run before this file's globals would be constructed.
struct State {
  std::mutex mu;                       // guards config
  std::shared_ptr<Config> config;      // null: no fault
  std::atomic<bool> active{false};     // fast path: any fault at all?
  std::string env_error;               // TESTDEV_FAULT parse error at load

  std::atomic<bool> trace{false};
  std::mutex trace_mu;                 // guards traced and traced_direct
  std::map<std::string, int64_t> traced;
  std::map<std::string, int64_t> traced_direct;
};

State& st() {
  static State* s = new State();  // never destroyed: ops may run at exit
  return *s;
}

const char* kGrammar =
    "expected OP=KIND[;OP=KIND...] with KIND one of scale:F, noise:R[:SEED], "
    "permute[:SEED], e.g. \"aten::gelu=scale:1.01;_softmax=noise:1e-3:7\"";

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  auto e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    auto pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return out;
}

// "gelu_" -> "gelu" (in-place variant), but "__and__" stays.
std::string strip_inplace(const std::string& qualified) {
  auto n = qualified.size();
  if (n >= 2 && qualified[n - 1] == '_' && qualified[n - 2] != '_' &&
      qualified[n - 2] != ':') {
    return qualified.substr(0, n - 1);
  }
  return qualified;
}

[[noreturn]] void bad(const std::string& item, const std::string& why) {
  TORCH_CHECK_VALUE(false, "testdev: bad fault \"", item, "\": ", why, "; ", kGrammar);
}

double parse_double(const std::string& item, const std::string& text, const char* what) {
  const std::string t = trim(text);
  if (t.empty()) bad(item, std::string("missing ") + what);
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || errno == ERANGE || !std::isfinite(v)) {
    bad(item, std::string(what) + " \"" + t + "\" is not a finite number");
  }
  return v;
}

uint64_t parse_seed(const std::string& item, const std::string& text) {
  const std::string t = trim(text);
  if (t.empty() || t.find_first_not_of("0123456789") != std::string::npos) {
    bad(item, "SEED \"" + t + "\" is not a non-negative integer");
  }
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(t.c_str(), &end, 10);
  if (errno == ERANGE) bad(item, "SEED \"" + t + "\" does not fit in 64 bits");
  return static_cast<uint64_t>(v);
}

// All aten op names known to the dispatcher, in-place variants folded.
const std::unordered_set<std::string>& known_aten_ops() {
  static const std::unordered_set<std::string> names = [] {
    std::unordered_set<std::string> s;
    for (const auto& on : c10::Dispatcher::singleton().getAllOpNames()) {
      if (on.name.rfind("aten::", 0) == 0) s.insert(strip_inplace(on.name));
    }
    return s;
  }();
  return names;
}

std::shared_ptr<Config> parse(const std::string& spec) {
  auto cfg = std::make_shared<Config>();
  for (const auto& raw : split(spec, ';')) {
    const std::string item = trim(raw);
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) bad(item, "no '=' between the op and the fault kind");
    std::string op = trim(item.substr(0, eq));
    const std::string kind = trim(item.substr(eq + 1));
    if (op.empty()) bad(item, "no op name before '='");
    if (op.find("::") == std::string::npos) op = "aten::" + op;
    const auto sep = op.find("::");
    const std::string ns = op.substr(0, sep);
    const std::string name = op.substr(sep + 2);
    if (name.find('.') != std::string::npos) {
      bad(item, "name the op without an overload (\"" + op.substr(0, op.find('.')) +
                    "\"): a fault applies to every overload of its op");
    }
    auto valid_ident = [](const std::string& s) {
      return !s.empty() && s.find_first_not_of(
                               "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") ==
                               std::string::npos;
    };
    if (!valid_ident(ns) || !valid_ident(name)) bad(item, "\"" + op + "\" is not an op name");
    op = strip_inplace(op);
    if (ns == "aten" && known_aten_ops().count(op) == 0) {
      bad(item, "no operator " + op + " is registered (check the spelling)");
    }
    if (cfg->by_op.count(op)) bad(item, "a second fault on " + op);

    auto f = std::make_unique<Fault>();
    f->op = op;
    const auto parts = split(kind, ':');
    const std::string k = trim(parts[0]);
    if (k == "scale") {
      if (parts.size() != 2) bad(item, "scale takes exactly one value: scale:F");
      f->kind = Kind::Scale;
      f->value = parse_double(item, parts[1], "F");
    } else if (k == "noise") {
      if (parts.size() < 2 || parts.size() > 3) bad(item, "noise takes noise:R or noise:R:SEED");
      f->kind = Kind::Noise;
      f->value = parse_double(item, parts[1], "R");
      if (!(f->value > 0)) bad(item, "noise size R must be > 0");
      if (parts.size() == 3) {
        f->seed = parse_seed(item, parts[2]);
        f->has_seed = true;
      }
    } else if (k == "permute") {
      if (parts.size() > 2) bad(item, "permute takes permute or permute:SEED");
      f->kind = Kind::Permute;
      if (parts.size() == 2) {
        f->seed = parse_seed(item, parts[1]);
        f->has_seed = true;
      }
    } else {
      bad(item, "unknown fault kind \"" + k + "\"");
    }
    cfg->by_op[op] = f.get();
    cfg->faults.push_back(std::move(f));
  }
  return cfg;
}

// ---- deterministic random numbers (splitmix64) ----------------------------

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  uint64_t below(uint64_t n) {  // in [0, n)
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
};

// One stream per (fault seed, firing number, output number): a run repeats
// exactly when the same ops fire in the same order.
Rng stream(uint64_t seed, uint64_t firing, uint64_t output) {
  Rng a{seed};
  uint64_t x = a.next() ^ (firing * 0xd1b54a32d192ed03ULL) ^ (output * 0x8cb92ba72f3d8dd7ULL);
  Rng r{x};
  r.next();
  return r;
}

// Calls fn(element offset) for every element of a strided tensor, in index order.
template <typename Fn>
void for_each_offset(c10::IntArrayRef sizes, c10::IntArrayRef strides, Fn&& fn) {
  const int64_t dim = static_cast<int64_t>(sizes.size());
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  if (n == 0) return;
  if (dim == 0) {
    fn(int64_t{0});
    return;
  }
  std::vector<int64_t> idx(dim, 0);
  int64_t off = 0;
  for (int64_t k = 0; k < n; ++k) {
    fn(off);
    for (int64_t d = dim - 1; d >= 0; --d) {
      if (++idx[d] < sizes[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (sizes[d] - 1);
      idx[d] = 0;
    }
  }
}

void apply_one(const Fault& f, const at::Tensor& t, Rng rng) {
  if (t.numel() == 0) return;
  if (at::has_internal_overlap(t) == at::MemOverlap::Yes) {
    TORCH_WARN_ONCE("testdev: fault on ", f.op,
                    " skipped an output whose elements overlap in memory");
    return;
  }
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "testdev_fault", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    scalar_t* p = static_cast<scalar_t*>(t.unsafeGetTensorImpl()->mutable_data());
    switch (f.kind) {
      case Kind::Scale: {
        const opmath_t factor = static_cast<opmath_t>(f.value);
        for_each_offset(sizes, strides, [&](int64_t o) {
          p[o] = static_cast<scalar_t>(static_cast<opmath_t>(p[o]) * factor);
        });
        break;
      }
      case Kind::Noise: {
        const double half_width = std::sqrt(3.0);  // U[-sqrt3, sqrt3]: variance 1
        for_each_offset(sizes, strides, [&](int64_t o) {
          const double u = (2.0 * rng.uniform01() - 1.0) * half_width;
          const opmath_t factor = static_cast<opmath_t>(1.0 + f.value * u);
          p[o] = static_cast<scalar_t>(static_cast<opmath_t>(p[o]) * factor);
        });
        break;
      }
      case Kind::Permute: {
        std::vector<scalar_t> vals;
        vals.reserve(static_cast<size_t>(t.numel()));
        for_each_offset(sizes, strides, [&](int64_t o) { vals.push_back(p[o]); });
        for (size_t i = vals.size(); i > 1; --i) {  // Fisher-Yates
          std::swap(vals[i - 1], vals[rng.below(i)]);
        }
        size_t i = 0;
        for_each_offset(sizes, strides, [&](int64_t o) { p[o] = vals[i++]; });
        break;
      }
    }
  });
}

// The arguments of this call that the op writes though its schema does not
// mark them (Tensor(a!)). cpu_fallback copies back only the marked ones, so
// the CPU kernel would update CPU copies that are then dropped.
// native_batch_norm (and its out= overload) updates running_mean and
// running_var, arguments 3 and 4, in place when training (argument 5): without
// this, BatchNorm's running statistics on testdev never moved.
std::vector<size_t> unmarked_writes(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                    size_t first_arg) {
  if (op.operator_name().name == "aten::native_batch_norm" && stack[first_arg + 5].toBool()) {
    return {3, 4};
  }
  return {};
}

std::shared_ptr<Config> current() {
  std::lock_guard<std::mutex> lock(st().mu);
  return st().config;
}

// Counts a call of `op` (`aten::gelu.out`) in `traced` while tracing.
void trace_into(std::map<std::string, int64_t> State::*traced, const c10::OperatorHandle& op) {
  State& s = st();
  if (!s.trace.load(std::memory_order_relaxed)) return;
  const auto& on = op.operator_name();
  std::string key = on.overload_name.empty() ? on.name : on.name + "." + on.overload_name;
  std::lock_guard<std::mutex> lock(s.trace_mu);
  if (s.trace.load()) ++(s.*traced)[key];
}

}  // namespace

void collect_tensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isList()) {
    for (const auto& e : v.toListRef()) {
      if (e.isTensor()) out.push_back(e.toTensor());
    }
  }
}

void apply_fault(Fault& f, const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> targets;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& t : outputs) {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1 ||
        t.layout() != c10::kStrided || !at::isFloatingType(t.scalar_type())) {
      continue;
    }
    if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
    targets.push_back(t);
  }
  if (targets.empty()) return;
  const auto firing = static_cast<uint64_t>(f.count.fetch_add(1));
  for (size_t i = 0; i < targets.size(); ++i) {
    apply_one(f, targets[i], stream(f.seed, firing, i));
  }
}

std::shared_ptr<Fault> fault_for(const c10::OperatorHandle& reached) {
  // Ops run with TESTING_ONLY_GenericMode excluded are an observer's own
  // bookkeeping (opdump computes its statistics that way): leave them alone.
  if (!st().active.load(std::memory_order_relaxed) ||
      c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::TESTING_ONLY_GenericMode)) {
    return nullptr;
  }
  auto cfg = current();
  if (!cfg) return nullptr;
  auto it = cfg->by_op.find(strip_inplace(reached.operator_name().name));
  if (it == cfg->by_op.end()) return nullptr;
  return std::shared_ptr<Fault>(cfg, it->second);  // shares the set's ownership
}

void set_fault(const std::string& spec) {
  auto cfg = parse(spec);  // throws, leaving the old set active
  std::lock_guard<std::mutex> lock(st().mu);
  st().env_error.clear();  // a valid spec replaces a bad TESTDEV_FAULT
  st().active.store(!cfg->faults.empty());
  st().config = cfg->faults.empty() ? nullptr : std::move(cfg);
}

std::string fault_spec() {
  auto cfg = current();
  std::string out;
  if (!cfg) return out;
  for (const auto& f : cfg->faults) {
    if (!out.empty()) out += ";";
    out += f->describe();
  }
  return out;
}

std::vector<std::pair<std::string, int64_t>> fault_counts() {
  std::vector<std::pair<std::string, int64_t>> out;
  auto cfg = current();
  if (!cfg) return out;
  for (const auto& f : cfg->faults) out.emplace_back(f->op, f->count.load());
  return out;
}

void reset_fault_counts() {
  auto cfg = current();
  if (!cfg) return;
  for (const auto& f : cfg->faults) f->count.store(0);
}

void init_faults_from_env() {
  const char* env = std::getenv("TESTDEV_FAULT");
  if (env == nullptr || trim(env).empty()) return;
  try {
    set_fault(env);
  } catch (const std::exception& e) {
    st().env_error = std::string("TESTDEV_FAULT=\"") + env + "\": " + e.what();
    std::fprintf(stderr, "testdev: ignoring TESTDEV_FAULT, no fault is active: %s\n",
                 st().env_error.c_str());
  }
}

std::string env_fault_error() {
  return st().env_error;
}

void set_trace(bool on) {
  std::lock_guard<std::mutex> lock(st().trace_mu);
  st().traced.clear();
  st().traced_direct.clear();
  st().trace.store(on);
}

std::vector<std::pair<std::string, int64_t>> traced_ops() {
  std::lock_guard<std::mutex> lock(st().trace_mu);
  return {st().traced.begin(), st().traced.end()};
}

void trace_direct_op(const c10::OperatorHandle& op) {
  trace_into(&State::traced_direct, op);
}

std::vector<std::pair<std::string, int64_t>> traced_direct_ops() {
  std::lock_guard<std::mutex> lock(st().trace_mu);
  return {st().traced_direct.begin(), st().traced_direct.end()};
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu(op, op, stack);
}

bool fallback_hidden() {
  // TESTDEV_HIDE_FALLBACK=1: what run_on_cpu dispatches itself (the copies
  // to the host and back, the CPU kernel's own dispatcher calls) runs with
  // an observer's key excluded, so an observer sees each op once, on
  // testdev, as with a backend whose kernels run on the device.
  static const bool hidden = env_switch("TESTDEV_HIDE_FALLBACK", false);
  return hidden;
}

void run_on_cpu(const c10::OperatorHandle& reached, const c10::OperatorHandle& op,
                torch::jit::Stack* stack) {
  Launch launch;  // the copies below are part of this one launch
  trace_into(&State::traced, reached);
  const std::shared_ptr<Fault> fault = fault_for(reached);
  const auto& args = op.schema().arguments();
  const size_t first_arg = stack->size() - args.size();

  // CPU kernels reject a generator of another device: hand them a CPU clone
  // of a testdev generator, then give its advanced state back.
  std::vector<std::pair<at::Generator, at::Generator>> generators;
  for (size_t i = 0; i < args.size(); ++i) {
    auto& v = (*stack)[first_arg + i];
    if (v.isGenerator()) {
      at::Generator gen = v.toGenerator();
      if (gen.defined() && gen.device().type() == c10::DeviceType::PrivateUse1) {
        at::Generator host;
        {
          std::lock_guard<std::mutex> lock(gen.mutex());
          host = gen.clone();
        }
        v = c10::IValue(host);
        generators.emplace_back(std::move(gen), std::move(host));
      }
    }
  }

  std::optional<c10::impl::ExcludeDispatchKeyGuard> hidden;
  if (fallback_hidden()) hidden.emplace(c10::DispatchKey::TESTING_ONLY_GenericMode);

  // Arguments written but not marked so: the CPU kernel gets CPU copies of
  // them, copied back afterwards as cpu_fallback does for marked ones.
  std::vector<std::pair<at::Tensor, at::Tensor>> unmarked;  // (testdev tensor, CPU copy)
  for (size_t i : unmarked_writes(op, *stack, first_arg)) {
    auto& v = (*stack)[first_arg + i];
    if (!v.isTensor()) continue;  // None
    at::Tensor t = v.toTensor();
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) continue;
    at::Tensor host = t.cpu();
    v = c10::IValue(host);
    unmarked.emplace_back(std::move(t), std::move(host));
  }

  // The outputs of an op are its returns plus the arguments it writes
  // (out=, in-place; some in-place ops such as _foreach_mul_ return nothing).
  std::vector<at::Tensor> outputs;
  if (fault != nullptr) {
    for (size_t i = 0; i < args.size(); ++i) {
      const auto* alias = args[i].alias_info();
      if (alias != nullptr && alias->isWrite()) collect_tensors((*stack)[first_arg + i], outputs);
    }
    for (const auto& [t, host] : unmarked) outputs.push_back(t);
  }

  at::native::cpu_fallback(op, stack);

  for (const auto& [t, host] : unmarked) at::_copy_from_and_resize(host, t);

  for (auto& [gen, host] : generators) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(host.get_state());
  }
  hidden.reset();
  if (fault != nullptr) {
    const size_t num_returns = op.schema().returns().size();
    for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
      collect_tensors((*stack)[i], outputs);
    }
    apply_fault(*fault, outputs);
  }
}

}  // namespace testdev
