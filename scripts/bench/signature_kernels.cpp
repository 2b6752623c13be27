// The fingerprint and sketch kernels alone: nanoseconds per element over
// 1M float32 values, and a check of both against the README's definition
// (the fingerprint word by word, the sketch as the O(n·K) sum), for runs
// split at places that are not block boundaries. Then the one-pass float32
// kernel (statistics, fingerprint and sketch from the same loads,
// cpp/stats/stats_avx2.cpp's add_block_signed) against the three kernels run in
// turn on the same blocks of 1,024, as cpp/stats/stats.cpp runs them, over a
// tensor of 16K values (64 KiB, about the TinyLM's mean measured tensor),
// with its results checked against both. Build and run from the repository
// root:
//
//   g++ -O3 -std=c++17 -mavx2 -mfma -mf16c -c cpp/signature/signature_avx2.cpp -Icpp -o /tmp/sig_avx2.o
//   g++ -O3 -std=c++17 -mavx2 -mfma -mf16c -c cpp/stats/stats_avx2.cpp -Icpp -o /tmp/stats_avx2.o
//   mkdir -p /tmp/siginc/opdump && ln -sfn "$PWD/cpp" /tmp/siginc/opdump/cpp
//   g++ -O3 -std=c++20 -DSTATS_HAVE_AVX2=1 -I/tmp/siginc cpp/signature/signature.cpp \
//       scripts/bench/signature_kernels.cpp /tmp/sig_avx2.o /tmp/stats_avx2.o -Icpp -o /tmp/sig_bench && /tmp/sig_bench

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "signature/signature.h"
#include "stats/stats_acc.h"

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

// The fingerprint of 32-bit words, word by word from the definition.
static uint64_t direct_fp(const uint32_t* u, int64_t n) {
  uint64_t f = 0;
  for (int64_t w = 0; w < n; ++w) {
    const uint32_t key = (fmix32(static_cast<uint32_t>(w >> 6) * kGolden + kBlockSeed) ^
                          fmix32(static_cast<uint32_t>(w & 63) * kGolden + kLaneSeed)) | 1u;
    f += static_cast<uint64_t>(u[w]) * key;
  }
  return f;
}

static int check_fingerprint() {
  std::vector<uint64_t> v(1000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = (static_cast<uint64_t>(fmix32(i)) << 32) | fmix32(i + 7);
  const auto* u32 = reinterpret_cast<const uint32_t*>(v.data());
  int bad = 0;
  for (int64_t cut : {0, 1, 63, 64, 65, 317, 999}) {
    Signature a, b;
    add_fingerprint(u32, cut, 0, Words::U32, a);
    add_fingerprint(u32 + cut, 2000 - cut, cut, Words::U32, a);
    bad += a.fingerprint() != direct_fp(u32, 2000);
    // 64-bit values are two words each, low first.
    add_fingerprint(v.data(), cut, 0, Words::U64, b);
    add_fingerprint(v.data() + cut, 1000 - cut, cut, Words::U64, b);
    bad += b.fingerprint() != direct_fp(u32, 2000);
  }
  std::printf("fingerprint against the definition: %s\n", bad == 0 ? "equal" : "DIFFERENT");
  return bad;
}

// The one-pass kernel against the three in turn: time per element (the
// faster of 5 rounds), and its statistics (bitwise), fingerprint (exactly)
// and sketch (to 1e-12 relative: its state is added up in another order)
// against theirs and against the definition.
static int one_pass() {
  constexpr int64_t n = 16384, block = 1024;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<float>(i) * 0.37f) * 3.0f + 0.5f;
  struct Out {
    opdump::Acc acc;
    Signature sig;
    double ns = 1e30;
  } three, one;
  auto run = [&](bool fused, Out& out) {
    for (int round = 0; round < 5; ++round) {
      const int reps = 2000;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) {
        opdump::Acc acc;
        Signature sig;
        sig.k = 16;
        SketchState st(16);
        for (int64_t s = 0; s < n; s += block) {
          if (fused) {
            opdump::avx2::add_block_signed(x.data() + s, block, s, acc, sig, st);
          } else {
            opdump::avx2::add_block(x.data() + s, block, acc);
            add_fingerprint(x.data() + s, block, s, Words::F32, sig);
            add_sketch_f32(x.data() + s, block, s, st);
          }
        }
        sketch_finish(st, sig);
        out.acc = acc;
        out.sig = sig;
      }
      const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      out.ns = std::min(out.ns, ns / (reps * static_cast<double>(n)));
    }
  };
  run(false, three);
  run(true, one);
  std::printf("one pass over blocks of 1,024 float32: %.3f ns/element, the three kernels in turn %.3f (%.0f%% less)\n",
              one.ns, three.ns, 100.0 * (1.0 - one.ns / three.ns));
  std::vector<double> xd(x.begin(), x.end());
  double want[32] = {};
  direct(xd.data(), n, 16, want);
  int bad = 0;
  bad += std::memcmp(&one.acc, &three.acc, sizeof one.acc) != 0;
  bad += one.sig.fingerprint() != three.sig.fingerprint();
  bad += one.sig.fingerprint() != direct_fp(reinterpret_cast<const uint32_t*>(x.data()), n);
  for (int j = 0; j < 16; ++j) bad += std::fabs(one.sig.sketch[j] - want[j]) > 1e-12 * (1.0 + std::fabs(want[j]));
  std::printf("one pass against the three kernels and the definition: %s\n", bad == 0 ? "equal" : "DIFFERENT");
  return bad;
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
  // Float32 values (the vector path signs them before widening), with a NaN
  // and infinities, which count as 0.
  std::vector<float> xf(1000);
  std::vector<double> xd(1000);
  for (size_t i = 0; i < xf.size(); ++i) {
    xf[i] = i == 5 ? NAN : i == 77 ? INFINITY : i == 300 ? -INFINITY : std::sin(static_cast<float>(i) * 1.7f);
    xd[i] = std::isfinite(xf[i]) ? xf[i] : 0.0;
  }
  for (int64_t cut : {0, 3, 16, 129, 999}) {
    double want[32] = {};
    direct(xd.data(), 1000, 16, want);
    Signature s;
    s.k = 16;
    SketchState st(16);
    if (!add_sketch_f32(xf.data(), cut, 0, st)) add_sketch(xd.data(), cut, 0, st);
    if (!add_sketch_f32(xf.data() + cut, 1000 - cut, cut, st)) add_sketch(xd.data() + cut, 1000 - cut, cut, st);
    sketch_finish(st, s);
    for (int j = 0; j < 16; ++j) bad += std::fabs(s.sketch[j] - want[j]) > 1e-9;
  }
  std::printf("sketch against the definition: %s\n", bad == 0 ? "equal" : "DIFFERENT");
  return bad + check_fingerprint() + one_pass() != 0;
}
