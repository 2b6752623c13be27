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

}  // namespace opdump
