// Autocast on testdev (autocast.cpp): registered on the key
// AutocastPrivateUse1 by testdev.cpp.
#pragma once

#include <torch/library.h>

namespace testdev {

// Every op the policy does not name passes the autocast key unchanged: a
// fallthrough on the key for all namespaces ("_").
void register_autocast_fallthrough(torch::Library& m);
// The policy's kernels, on a library for namespace aten.
void register_autocast_kernels(torch::Library& m);

}  // namespace testdev
