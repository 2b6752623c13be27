// testdev's kernels for opdump::fused_stats and opdump::fused_stats_batch
// (README.md, "Fused statistics"): the statistics row of a tensor in one
// pass, and the rows of several tensors (with their fingerprints and
// sketches) in one launch, as a backend with its own fused reduction gives
// them to an observer.
#pragma once

#include <torch/library.h>

namespace testdev {

// Registers the kernels on `opdump_impl` (an IMPL library of namespace
// opdump for PrivateUse1): fused_stats unless TESTDEV_FUSED_STATS=0, and
// fused_stats_batch unless either that or TESTDEV_FUSED_BATCH=0 (both read
// once, at load). Also defines testdev::fused_batch_enabled(), which
// reports the second switch.
void register_fused_stats(torch::Library& opdump_impl);

// Whether fused_stats is registered (TESTDEV_FUSED_STATS is not 0).
bool fused_stats_enabled();

// Whether fused_stats_batch is registered (neither TESTDEV_FUSED_STATS nor
// TESTDEV_FUSED_BATCH is 0).
bool fused_batch_enabled();

}  // namespace testdev
