// The counters of the testdev device and its simulated costs (counters.h).

#include "counters.h"

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace testdev {
namespace {

// Per kind of thread: the job's thread, and all the others.
struct ByThread {
  std::atomic<int64_t> job{0};
  std::atomic<int64_t> other{0};
};

// Process-wide state, built on first use: testdev.cpp's static initialiser
// (which allocates and reads the environment) may run before this file's
// globals would be constructed.
struct State {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};

  std::atomic<std::thread::id> job_thread{};  // none: every thread is "other"
  ByThread waits;
  ByThread launches;
  std::atomic<int64_t> observer_launches{0};

  std::atomic<bool> capturing{false};
  std::atomic<int64_t> capture_observer_launches{0};
  std::atomic<int64_t> capture_waits{0};

  std::atomic<double> sync_us{0};
  std::atomic<double> launch_us{0};
  std::string env_error;  // TESTDEV_SYNC_US / TESTDEV_LAUNCH_US errors at load
};

State& st() {
  static State* s = new State();  // never destroyed: tensors are freed at exit
  return *s;
}

// Depth of testdev kernel calls on this thread (Launch).
thread_local int t_kernel_depth = 0;

std::atomic<int64_t>& mine(ByThread& counts) {
  return std::this_thread::get_id() == st().job_thread.load() ? counts.job : counts.other;
}

// A stall that costs time on a CPU. Busy-waits: sleeping is too coarse
// (tens of microseconds at best) for costs of a few microseconds.
void spin(double us) {
  if (!(us > 0)) return;
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::nanoseconds(static_cast<int64_t>(std::llround(us * 1000)));
  while (std::chrono::steady_clock::now() < end) {
  }
}

void check_cost(const char* what, double us) {
  TORCH_CHECK_VALUE(std::isfinite(us) && us >= 0, "testdev: ", what,
                    " must be a finite number of microseconds >= 0, got ", us);
}

// One cost variable: unset or blank leaves the cost at 0.
void cost_from_env(const char* name, std::atomic<double>& cost) {
  const char* env = std::getenv(name);
  if (env == nullptr) return;
  const std::string text(env);
  if (text.find_first_not_of(" \t") == std::string::npos) return;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  while (end != nullptr && (*end == ' ' || *end == '\t')) ++end;
  if (end == text.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < 0) {
    std::string& err = st().env_error;
    if (!err.empty()) err += "; ";
    err += std::string(name) + "=\"" + text +
           "\" is not a number of microseconds >= 0 (the cost stays 0)";
    return;
  }
  cost.store(v);
}

}  // namespace

// ---- memory ------------------------------------------------------------------

void memory_acquired(size_t nbytes) {
  State& s = st();
  const int64_t now = s.allocated.fetch_add(static_cast<int64_t>(nbytes)) +
                      static_cast<int64_t>(nbytes);
  int64_t peak = s.peak.load();
  while (now > peak && !s.peak.compare_exchange_weak(peak, now)) {
  }
}

void memory_released(size_t nbytes) {
  st().allocated.fetch_sub(static_cast<int64_t>(nbytes));
}

std::vector<int64_t> memory_stats() {
  return {st().allocated.load(), st().peak.load()};
}

void reset_peak_memory() {
  st().peak.store(st().allocated.load());
}

// ---- threads -----------------------------------------------------------------

void set_job_thread() {
  st().job_thread.store(std::this_thread::get_id());
}

// ---- launches ----------------------------------------------------------------

Launch::Launch() : nested_(t_kernel_depth++ > 0) {
  if (nested_) return;
  State& s = st();
  ++mine(s.launches);
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::TESTING_ONLY_GenericMode)) {
    ++s.observer_launches;
    if (s.capturing.load()) ++s.capture_observer_launches;
  }
  spin(s.launch_us.load());
}

Launch::~Launch() {
  --t_kernel_depth;
}

std::vector<int64_t> launches() {
  const State& s = st();
  return {s.launches.job.load(), s.launches.other.load(), s.observer_launches.load()};
}

// ---- host waits --------------------------------------------------------------

void host_wait() {
  State& s = st();
  if (s.capturing.load()) {
    ++s.capture_waits;
    TORCH_CHECK(false, "testdev: host wait while the stream is capturing");
  }
  ++mine(s.waits);
  spin(s.sync_us.load());
}

std::vector<int64_t> host_waits() {
  return {st().waits.job.load(), st().waits.other.load()};
}

void reset_counters() {
  State& s = st();
  for (auto* c : {&s.waits.job, &s.waits.other, &s.launches.job, &s.launches.other,
                  &s.observer_launches, &s.capture_observer_launches, &s.capture_waits}) {
    c->store(0);
  }
}

// ---- simulated costs ---------------------------------------------------------

void set_costs(std::optional<double> sync_us, std::optional<double> launch_us) {
  // Check both before changing either: a bad call changes nothing.
  if (sync_us) check_cost("sync_us", *sync_us);
  if (launch_us) check_cost("launch_us", *launch_us);
  if (sync_us) st().sync_us.store(*sync_us);
  if (launch_us) st().launch_us.store(*launch_us);
}

std::vector<double> costs() {
  return {st().sync_us.load(), st().launch_us.load()};
}

void init_costs_from_env() {
  cost_from_env("TESTDEV_SYNC_US", st().sync_us);
  cost_from_env("TESTDEV_LAUNCH_US", st().launch_us);
  if (!st().env_error.empty()) {
    std::fprintf(stderr, "testdev: ignoring %s\n", st().env_error.c_str());
  }
}

std::string env_cost_error() {
  return st().env_error;
}

// ---- graph capture -----------------------------------------------------------

void capture_begin() {
  TORCH_CHECK(!st().capturing.exchange(true), "testdev: the stream is already capturing");
}

void capture_end() {
  TORCH_CHECK(st().capturing.exchange(false), "testdev: capture_end without capture_begin");
}

bool capturing() {
  return st().capturing.load();
}

std::vector<int64_t> capture_counts() {
  return {st().capture_observer_launches.load(), st().capture_waits.load()};
}

}  // namespace testdev
