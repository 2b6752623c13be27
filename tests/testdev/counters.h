// What the testdev device counts, and what its work costs (README.md, "What
// the device counts"): the memory it holds, host waits and kernel launches
// (per thread), graph capture, and the simulated costs TESTDEV_SYNC_US and
// TESTDEV_LAUNCH_US that make a stall cost time on a CPU.
//
// testdev's work is synchronous, so none of this changes a result: it lets a
// test see how an observer such as opdump uses a device (how often it makes
// the program's thread wait, how much device memory it keeps, whether it
// launches work while a graph is being captured).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace testdev {

// ---- memory ------------------------------------------------------------------

// Bytes the device takes (an allocation, an adopted output) and gives back.
void memory_acquired(size_t nbytes);
void memory_released(size_t nbytes);
// {bytes held now, the most held since the last reset}.
std::vector<int64_t> memory_stats();
void reset_peak_memory();  // peak := bytes held now

// ---- threads -----------------------------------------------------------------

// Marks the calling thread as the job's thread: its waits and launches count
// as "job", every other thread's as "other".
void set_job_thread();

// ---- launches ----------------------------------------------------------------

// One testdev kernel call, for its duration. The outermost one on a thread
// counts a launch and pays TESTDEV_LAUNCH_US; the testdev kernels it calls
// itself (the fallback's copies to and from the host) are part of it and
// count nothing. A launch also counts as "observer" when the caller runs with
// TESTING_ONLY_GenericMode excluded (how opdump runs its own statistics), and
// as a capture launch when that happens while the stream is capturing.
class Launch {
 public:
  Launch();
  ~Launch();
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;
  bool nested() const {
    return nested_;
  }

 private:
  bool nested_;
};

// {job, other, observer}.
std::vector<int64_t> launches();

// ---- host waits --------------------------------------------------------------

// The host waits for the device: counts it and pays TESTDEV_SYNC_US. While
// the stream is capturing it raises instead (as CUDA refuses to synchronise
// then), counting a capture wait.
void host_wait();
// {job, other}.
std::vector<int64_t> host_waits();

// Zeroes waits, launches and the capture counts (not memory).
void reset_counters();

// ---- simulated costs ---------------------------------------------------------

// Microseconds of busy-waiting per host wait and per launch; nullopt keeps
// the current value. Throws c10::ValueError for a negative or non-finite one.
void set_costs(std::optional<double> sync_us, std::optional<double> launch_us);
// {sync_us, launch_us}.
std::vector<double> costs();
// Reads TESTDEV_SYNC_US and TESTDEV_LAUNCH_US once, when the library loads.
// A bad value is reported on stderr and kept here; that cost stays 0.
void init_costs_from_env();
std::string env_cost_error();

// ---- graph capture -----------------------------------------------------------

// Marks (and unmarks) a graph capture on the device's one stream. Throws when
// one is already marked (begin) or none is (end).
void capture_begin();
void capture_end();
bool capturing();
// {observer launches, host waits refused} during captures.
std::vector<int64_t> capture_counts();

}  // namespace testdev
