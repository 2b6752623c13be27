// Direct kernels of the testdev backend (README.md, "Direct kernels"): the
// ops an observer's statistics use run their CPU kernel on host aliases of
// their testdev arguments, and the device adopts the CPU outputs, with no
// copy either way. Every other op keeps the copying fallback (faults.cpp).
#pragma once

#include <torch/library.h>

#include <string>

namespace testdev {

// Registers the direct kernels on `m` (an IMPL library of aten for
// PrivateUse1), unless TESTDEV_DIRECT=0. Reads TESTDEV_DIRECT, once.
void register_direct_kernels(torch::Library& m);

// Whether the direct kernels are registered.
bool direct_enabled();

// A malformed TESTDEV_DIRECT, reported on stderr when the library loads and
// kept here ("" when none); the direct kernels stay on then.
std::string env_direct_error();

}  // namespace testdev
