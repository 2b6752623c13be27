// What the device itself (testdev.cpp) shares with the other files of the
// testdev backend.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace testdev {

constexpr c10::DeviceType kDev = c10::DeviceType::PrivateUse1;

// A CPU tensor over the same host memory as a testdev tensor (no copy); any
// other tensor is returned as it is. The alias keeps the testdev storage
// alive.
at::Tensor host_alias(const at::Tensor& t);

// A 0/1 switch from the environment, read when the library loads: `name`
// unset or empty gives `otherwise`. Any other value is reported on stderr,
// kept for env_error() (load() raises it) and also gives `otherwise`.
bool env_switch(const char* name, bool otherwise);
// What env_switch found malformed ("" when nothing).
std::string env_switch_errors();

}  // namespace testdev
