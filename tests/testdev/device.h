// What the device itself (testdev.cpp) shares with the other files of the
// testdev backend.
#pragma once

#include <ATen/core/Tensor.h>

namespace testdev {

constexpr c10::DeviceType kDev = c10::DeviceType::PrivateUse1;

// A CPU tensor over the same host memory as a testdev tensor (no copy); any
// other tensor is returned as it is. The alias keeps the testdev storage
// alive.
at::Tensor host_alias(const at::Tensor& t);

}  // namespace testdev
