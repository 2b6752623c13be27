// The C++ side of opdump: torch work only (the dispatcher fallback, the
// statistics, the thread hook). Everything else is in Rust (src/).
#pragma once

#include <cstdint>

#include "rust/cxx.h"

namespace opdump {

// Called from Rust (src/bridge.rs).
bool install();
void set_active(bool on);
rust::String torch_version();
int64_t distributed_rank();
// Device statistics (device_stats.cpp): wait for those launched so far; how
// many were measured, dropped, skipped in a capture, waited for, failed.
bool device_flush(int64_t timeout_ms);
rust::Vec<int64_t> device_counts();
// The accuracy check's thread (accuracy_check.cpp): at exit, drop what is
// queued after the check under way.
void check_abandon();

}  // namespace opdump
