// testdev's kernel for opdump::fused_stats (README.md, "Fused statistics"):
// the statistics row of a tensor in one pass, as a backend with its own
// fused reduction gives it to an observer.
#pragma once

#include <torch/library.h>

namespace testdev {

// Registers the kernel on `opdump_impl` (an IMPL library of namespace opdump
// for PrivateUse1), unless TESTDEV_FUSED_STATS=0 (read once, at load).
void register_fused_stats(torch::Library& opdump_impl);

// Whether the kernel is registered (TESTDEV_FUSED_STATS is not 0).
bool fused_stats_enabled();

}  // namespace testdev
