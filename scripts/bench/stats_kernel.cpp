// The float32 statistics kernels alone, side by side: the AVX2 one
// (cpp/stats/stats_avx2.cpp) and, where the CPU has AVX-512, the AVX-512 one
// in front of it as cpp/stats/stats.cpp calls them (cpp/stats/stats_avx512.cpp,
// which hands the AVX2 kernel the blocks it leaves). Nanoseconds per float32
// element over a buffer in cache (256 KiB) and one in memory (64 MiB), blocks
// of 1,024 as cpp/stats/stats.cpp hands them, and the mean and the sum of
// squared deviations against a long double two-pass reference, for random
// values, a mean large against the spread, and blocks whose first value (the
// AVX2 kernel's pivot) is an outlier. Build and run from the repository root:
//
//   g++ -O3 -std=c++20 -Icpp scripts/bench/stats_kernel.cpp -c -o /tmp/sb.o && \
//   g++ -O3 -std=c++20 -mavx2 -mfma -mf16c -Icpp -c cpp/stats/stats_avx2.cpp -o /tmp/sb2.o && \
//   g++ -O3 -std=c++20 -mavx512f -mavx512vl -mavx512dq -mfma -Icpp -c cpp/stats/stats_avx512.cpp -o /tmp/sb5.o && \
//   g++ /tmp/sb.o /tmp/sb2.o /tmp/sb5.o -o /tmp/stats_bench && /tmp/stats_bench

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "stats/stats_acc.h"

using opdump::Acc;

// Which kernels: the AVX2 one alone, or the AVX-512 one in front of it.
static bool g_avx512 = false;

static Acc run(const std::vector<float>& x) {
  Acc acc;
  for (size_t s = 0; s < x.size(); s += 1024) {
    const auto m = static_cast<int64_t>(std::min<size_t>(1024, x.size() - s));
    if (g_avx512 && opdump::avx512::add_block(x.data() + s, m, acc)) continue;
    opdump::avx2::add_block(x.data() + s, m, acc);
  }
  return acc;
}

static void check(const char* what, const std::vector<float>& x) {
  long double sum = 0;
  for (float v : x) sum += v;
  const long double mean = sum / x.size();
  long double m2 = 0;
  for (float v : x) m2 += (v - mean) * (v - mean);
  const Acc a = run(x);
  std::printf("  %-26s mean rel. error %.1e, m2 rel. error %.1e\n", what,
              static_cast<double>(std::fabs((a.mean - mean) / mean)), static_cast<double>(std::fabs((a.m2 - m2) / m2)));
}

static void kernels(const char* name) {
  std::mt19937 g(1);
  std::normal_distribution<float> normal(3.0f, 0.5f);
  std::printf("%s\n", name);
  for (size_t n : {size_t{1} << 16, size_t{1} << 24}) {
    std::vector<float> x(n);
    for (auto& v : x) v = normal(g);
    const int reps = static_cast<int>(std::max<size_t>(1, (size_t{1} << 28) / n));
    std::vector<double> ns;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      double sink = 0;
      for (int i = 0; i < reps; ++i) sink += run(x).m2;
      ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                   (static_cast<double>(reps) * n));
      if (sink == 42) std::puts("");
    }
    std::sort(ns.begin(), ns.end());
    std::printf("  %8zu KiB of float32: %.3f ns per element (median of 7)\n", n * 4 / 1024, ns[3]);
  }
  std::vector<float> x(1 << 20);
  for (auto& v : x) v = normal(g);
  check("random, mean 3, std 0.5", x);
  for (auto& v : x) v += 13.0f;
  check("mean 16, std 0.5", x);
  for (auto& v : x) v += 1000.0f;
  check("mean 1016, std 0.5", x);
  for (size_t s = 0; s < x.size(); s += 1024) x[s] = -60000.0f;
  check("outlier first in a block", x);
}

int main() {
  if (!opdump::avx2::usable()) {
    std::puts("this CPU has no AVX2/FMA/F16C: the portable path is used instead");
    return 0;
  }
  kernels("AVX2");
  if (!opdump::avx512::usable()) {
    std::puts("this CPU has no AVX-512 (F, VL, DQ): the AVX2 kernel is used alone");
    return 0;
  }
  g_avx512 = true;
  kernels("AVX-512 in front of AVX2");
  return 0;
}
