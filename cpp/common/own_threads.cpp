// The one place C++ starts a thread of opdump's (the checking thread, the
// CPU check of online compare, the device completion thread). Each keeps
// the rule of every thread opdump starts (Rust's opdump_fsguard::spawn):
// SIGXFSZ is blocked before its body runs, so a write past `ulimit -f`
// fails as a full disk and never kills the job. Without it a thread
// started from the job's thread inherits the job's mask.

#include <pthread.h>

#include <thread>

#include "opdump/cpp/common/common.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

void start_thread(const char* name, std::function<void()> body) {
  std::thread([name, body = std::move(body)]() mutable {
    own_thread_started();
    pthread_setname_np(pthread_self(), name);
    body();
  }).detach();
}

}  // namespace opdump
