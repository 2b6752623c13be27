// Declarations the files of stats/ share only among themselves; what other
// folders use is in stats/stats.h.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "opdump/cpp/stats/stats.h"

namespace opdump {

// The cache of measured tensors (reuse.cpp, see reuse_remember): fills
// row.stats (and the signature), or sets `pending`, `repeat` and
// `pending_signature` when the statistics are still on their way.
bool reuse_lookup(const at::Tensor& t, TensorRow& row, DeviceResultPtr& pending, int64_t& repeat,
                  bool& pending_signature);

}  // namespace opdump
