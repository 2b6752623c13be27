// Autocast on testdev: what torch.autocast(device_type="testdev") needs from
// the C++ side.
//
// A PrivateUse1 tensor carries the dispatch key AutocastPrivateUse1, and
// torch.autocast enables it for the block. PyTorch registers nothing on that
// key: a backend brings its own policy. testdev uses the op lists PyTorch
// shares between its accelerators (AT_FORALL_* in ATen/autocast_mode.h, as
// for CUDA and XPU), so that a mixed-precision run on testdev casts what a
// run on a GPU casts:
//   - lower_precision_fp: matmuls, linear, convolutions, attention run in the
//     autocast dtype (their floating inputs cast, fp32 weights cached);
//   - fp32: ops that need range or precision (exp, log, norms, losses) run in
//     float32;
//   - fp32_set_opt_dtype: reductions and softmax accumulate in float32;
//   - promote: ops of several inputs run in their widest type.
// Every other op falls through to the next key with its inputs as they are.
// The casts are the ops' own (`_to_copy` on testdev), so an observer sees them
// and faults apply to them as to any op.

#include "autocast.h"

#include <ATen/autocast_mode.h>

namespace testdev {

void register_autocast_fallthrough(torch::Library& m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

// KERNEL_PRIVATEUSEONE and the AT_FORALL_* lists expand to m.impl(...) calls
// on a library named `m`.
void register_autocast_kernels(torch::Library& m) {
#define TESTDEV_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(TESTDEV_LOWER_PRECISION_FP)
#undef TESTDEV_LOWER_PRECISION_FP

#define TESTDEV_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(TESTDEV_FP32)
#undef TESTDEV_FP32

#define TESTDEV_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(TESTDEV_FP32_SET_OPT_DTYPE)
#undef TESTDEV_FP32_SET_OPT_DTYPE

  {
    // The list spells its signatures as inside namespace at.
    using at::IntArrayRef, at::Scalar, at::ScalarType, at::Tensor;
    AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  }

#define TESTDEV_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(TESTDEV_PROMOTE)
#undef TESTDEV_PROMOTE
}

}  // namespace testdev
