// The counts of device measurements that torch.ops.opdump.device_stats()
// reports (device_counters.cpp).
#pragma once

#include <atomic>
#include <cstdint>

namespace opdump::devstats {

// Launched; not made because the pool of pending results stayed full, or
// because the stream was capturing a graph; waits of the job's thread for
// that pool (or for each result under OPDUMP_DEVICE_SYNC); failed on the
// device.
extern std::atomic<int64_t> g_measured, g_dropped, g_capturing, g_job_waits, g_failed;
// Held tensors read early, before an op wrote their memory (counted per op
// and batch).
extern std::atomic<int64_t> g_early_reads;

}  // namespace opdump::devstats
