// A measurement of a long run of elements, split into fixed chunks measured
// in parallel on torch's intra-op pool and merged in chunk order, so the
// result does not depend on the thread count. Shared by the statistics
// (stats.cpp) and the signature of a copy in logical order
// (signature_cpu.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <ATen/Parallel.h>

namespace opdump {

// 64K elements (256 KiB of float32, about 13 µs of statistics): long enough
// that waking the pool's threads costs little against it, short enough that
// the mid-size tensors of a small model (an MLP's hidden activations, the
// logits) are split over two threads.
constexpr int64_t kChunk = int64_t{1} << 16;

// run(first, len) measures elements [first, first + len); R has merge().
// Runs of less than two chunks are measured at once; longer ones always in
// chunks, with one thread too (parallel_for then runs them in order), so
// that the merge, and the last bits of the result, are the same at every
// thread count. `total` is what the chunks are merged into.
template <typename R, typename Run>
R chunked(int64_t n, R total, Run run) {
  if (n < 2 * kChunk) return run(0, n);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<R> parts(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) parts[c] = run(c * kChunk, std::min(kChunk, n - c * kChunk));
  });
  for (const auto& p : parts) total.merge(p);
  return total;
}

}  // namespace opdump
