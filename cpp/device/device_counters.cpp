// The counts of device measurements (see device_counters.h).

#include "opdump/cpp/device/device_counters.h"

#include "opdump/cpp/opdump.h"
#include "opdump/src/bridge.rs.h"

namespace opdump {

namespace devstats {
std::atomic<int64_t> g_measured{0}, g_dropped{0}, g_capturing{0}, g_job_waits{0}, g_failed{0}, g_early_reads{0};
}  // namespace devstats

rust::Vec<int64_t> device_counts() {
  rust::Vec<int64_t> v;
  for (const auto* c : {&devstats::g_measured, &devstats::g_dropped, &devstats::g_capturing,
                         &devstats::g_job_waits, &devstats::g_failed, &devstats::g_early_reads})
    v.push_back(c->load(std::memory_order_relaxed));
  return v;
}

}  // namespace opdump
