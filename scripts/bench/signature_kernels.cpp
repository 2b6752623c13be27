// The fingerprint and sketch kernels alone: nanoseconds per element over
// 1M float32 values, and a check of the sketch against the O(n·K) sum of
// the README's definition. Build and run from the repository root:
//
//   g++ -O3 -std=c++17 -mavx2 -mfma -c cpp/signature_avx2.cpp -Icpp -o /tmp/sig_avx2.o
//   mkdir -p /tmp/siginc/opdump && ln -sfn "$PWD/cpp" /tmp/siginc/opdump/cpp
//   g++ -O3 -std=c++20 -DSTATS_HAVE_AVX2=1 -I/tmp/siginc cpp/signature.cpp \
//       scripts/bench/signature_kernels.cpp /tmp/sig_avx2.o -Icpp -o /tmp/sig_bench && /tmp/sig_bench

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "signature.h"

using namespace opdump::sig;

// sketch_j = sum_i s_ij x_i, straight from the definition.
static void direct(const double* x, int64_t n, int k, double* out) {
  const int lg = __builtin_ctz(static_cast<unsigned>(k));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t g = static_cast<uint32_t>(i >> lg) * kGolden;
    const uint32_t r = static_cast<uint32_t>(i & (k - 1));
    const uint32_t a = fmix32(g + kSignSeed), c = fmix32(g + kProjSeed) & (k - 1);
    for (int j = 0; j < k; ++j) {
      const int parity = ((a >> r) & 1) + __builtin_popcount((r ^ c) & j);
      out[j] += parity & 1 ? -x[i] : x[i];
    }
  }
}

int main() {
  const int64_t n = 1 << 20;
  std::vector<float> f(n);
  for (int64_t i = 0; i < n; ++i) f[i] = std::sin(static_cast<float>(i) * 0.001f);
  for (int rep = 0; rep < 3; ++rep) {
    Signature s;
    s.k = 16;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 20; ++r) add_fingerprint(f.data(), n, 0, Words::F32, s);
    const auto t1 = std::chrono::steady_clock::now();
    SketchState st(16);
    for (int r = 0; r < 20; ++r) add_sketch_f32(f.data(), n, 0, st);
    const auto t2 = std::chrono::steady_clock::now();
    std::printf("fingerprint %.3f ns/element, sketch %.3f ns/element\n",
                std::chrono::duration<double>(t1 - t0).count() / (20.0 * n) * 1e9,
                std::chrono::duration<double>(t2 - t1).count() / (20.0 * n) * 1e9);
  }
  std::vector<double> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(static_cast<double>(i) * 0.37);
  int bad = 0;
  for (int k : {2, 4, 8, 16, 32}) {
    double want[32] = {};
    direct(x.data(), 1000, k, want);
    Signature s;
    s.k = k;
    SketchState st(k);
    add_sketch(x.data(), 317, 0, st);
    add_sketch(x.data() + 317, 683, 317, st);
    sketch_finish(st, s);
    for (int j = 0; j < k; ++j) bad += std::fabs(s.sketch[j] - want[j]) > 1e-9;
  }
  std::printf("sketch against the definition: %s\n", bad == 0 ? "equal" : "DIFFERENT");
  return bad != 0;
}
