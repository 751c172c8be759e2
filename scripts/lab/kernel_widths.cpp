// The kernels' width curve without torch: one kind of matrix at the default target's widest shape,
// timed at each pass width, cold (cycling through enough copies that none is in cache, as in
// decoding) and hot (a matrix small enough to stay in L2, so the figure is the kernel's arithmetic).
//
//   CXX="g++ -std=c++17 -O3 -fopenmp -ffp-contract=off ISA_FLAGS -DSPECCHAT_ISA_X"
//   $CXX -Ispecchat/kernels scripts/lab/kernel_widths.cpp -o kw
//   OMP_NUM_THREADS=1 ./kw KIND [WIDTHS] [REPS]
//
// KIND is q4, q5, q6 or q8; WIDTHS a comma-separated list (default 1,2,4,8,16). Prints each
// width's median time per product in µs, cold and hot, and its ratio to width 1. To compare
// with another tree's kernels (another checkout's specchat/kernels, the same packed layout),
// build them into the program too, and the two take turns product by product, so that a
// machine whose speed drifts favours neither; the last column is this tree's time over theirs:
//   $CXX -IOTHER/specchat/kernels -DBASELINE_ONLY -c scripts/lab/kernel_widths.cpp -o baseline.o
//   $CXX -Ispecchat/kernels -DBASELINE scripts/lab/kernel_widths.cpp baseline.o -o kw
// With one thread the times are the thread's own CPU time (other work on the machine may take
// the core away), with more the wall time. Under `valgrind --tool=callgrind`
// (CALLGRIND=1: each width once, one copy) the instruction counts are a cross-check no other
// work can move; valgrind runs the AVX2 and scalar builds, not AVX-512.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

// A copy of the kernels in a namespace of its own (their headers' standard includes are done), with
// the split of ATen's at::parallel_for: one contiguous piece of the range per thread.
#define SPECCHAT_KERNELS(NS)                                                         \
  namespace NS {                                                                     \
  namespace {                                                                        \
  template <typename Fn>                                                             \
  void parallel_for(int64_t begin, int64_t end, int64_t, const Fn& fn) {             \
    const int64_t n = end - begin;                                                   \
    if (n <= 0) return;                                                              \
    _Pragma("omp parallel") {                                                        \
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();       \
      const int64_t chunk = (n + threads - 1) / threads;                             \
      const int64_t b = begin + t * chunk, e = std::min(end, b + chunk);             \
      if (b < e) fn(b, e);                                                           \
    }                                                                                \
  }                                                                                  \
  }                                                                                  \
  }

struct Arrays {
  std::vector<uint8_t> q, sc, mn, qh;
  std::vector<uint16_t> d, dm;
};

// The kernels' view of the arrays (every tree's Matrix has these fields in this order).
template <typename Matrix>
Matrix view(const Arrays& p, int kind, int64_t N, int64_t K) {
  const bool nibbles = kind == 4 || kind == 5;
  return Matrix{static_cast<decltype(Matrix::kind)>(kind), p.q.data(), p.sc.data(), nibbles ? p.mn.data() : nullptr, p.d.data(),
                nibbles ? p.dm.data() : nullptr, kind == 5 || kind == 6 ? p.qh.data() : nullptr,
                256, kind == 8 ? 128 : kind == 6 ? 32 : 0, N, K, N / 16, nullptr};
}

#ifdef BASELINE_ONLY
// The other tree's kernels behind one function (this file's first build).
namespace baseline {
#include "core/kernels.h"
}
SPECCHAT_KERNELS(baseline)
void baseline_product(const Arrays& a, int kind, int64_t N, int64_t K, const float* x, int64_t M, float* y) {
  const baseline::Matrix m = view<baseline::Matrix>(a, kind, N, K);
  baseline::run_group({&m}, x, M, {m.blocks}, {y});
}
#else
namespace current {
#include "core/kernels.h"
}
SPECCHAT_KERNELS(current)
#ifdef BASELINE
void baseline_product(const Arrays& a, int kind, int64_t N, int64_t K, const float* x, int64_t M, float* y);
#endif

namespace {

Arrays random_arrays(int kind, int64_t N, int64_t K, std::mt19937& rng) {
  const int64_t S = 256, blocks = N / 16, group = kind == 8 ? 16 : 32;
  Arrays p;
  auto bytes = [&](int64_t n, uint32_t below) {
    std::vector<uint8_t> out(n);
    for (auto& b : out) b = static_cast<uint8_t>(rng() % below);
    return out;
  };
  auto halves = [&](int64_t n) {
    std::vector<uint16_t> out(n);
    for (auto& h : out) h = static_cast<uint16_t>((5 + rng() % 4) << 10 | rng() % 1024);
    return out;
  };
  const bool nibbles = kind == 4 || kind == 5;
  p.q = bytes(blocks * (K / group) * 256, 256);
  p.sc = bytes(blocks * (K / (nibbles ? 32 : 16)) * 16, nibbles ? 64 : 256);
  if (nibbles) {
    p.mn = bytes(blocks * (K / 32) * 16, 64);
    p.dm = halves(blocks * (K / S) * 16);
  }
  if (kind == 5) p.qh = bytes(blocks * (K / 32) * 64, 256);
  if (kind == 6) p.qh = bytes(blocks * (K / 32) * 128, 256);
  p.d = halves(blocks * (K / S) * 16);
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s q4|q5|q6|q8 [WIDTHS] [REPS]\n", argv[0]);
    return 2;
  }
  const int kind = std::atoi(argv[1] + 1);
  std::vector<int64_t> widths;
  for (std::string list = argc > 2 ? argv[2] : "1,2,4,8,16"; !list.empty();) {
    const size_t comma = list.find(',');
    widths.push_back(std::stoll(list.substr(0, comma)));
    list = comma == std::string::npos ? "" : list.substr(comma + 1);
  }
  const int reps = argc > 3 ? std::atoi(argv[3]) : 15;
  const bool callgrind = std::getenv("CALLGRIND") != nullptr;
  const int64_t N = 8960, K = 1536;  // the 1.5B target's gate and up matrices
  std::mt19937 rng(1);
  // 8 copies: 8 x 7.7 MB of q4 is twice the L3 cache of the machine this was written on.
  const int copies = callgrind ? 1 : 8;
  std::vector<Arrays> arrays;
  for (int c = 0; c < copies; ++c) arrays.push_back(random_arrays(kind, N, K, rng));
  // The hot figure's matrix: a 16th of the rows, so that it stays in a core's L2 cache (at most
  // 0.8 MB, q8); its time is scaled by 16 to compare with the cold product's.
  const int64_t hot_n = N / 16;
  const Arrays small = random_arrays(kind, hot_n, K, rng);
  const int64_t widest = *std::max_element(widths.begin(), widths.end());
  std::vector<float> x(widest * K), y(widest * N);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.f;

  // Each build: a function that multiplies matrix `which` (-1: the hot one) by the first M rows.
  struct Build {
    const char* name;
    std::function<void(int, int64_t)> product;
  };
  std::vector<Build> builds;
  std::vector<current::Matrix> now_cold;
  for (const Arrays& a : arrays) now_cold.push_back(view<current::Matrix>(a, kind, N, K));
  const current::Matrix now_hot = view<current::Matrix>(small, kind, hot_n, K);
  builds.push_back({"this tree", [&](int which, int64_t M) {
                      const current::Matrix& m = which < 0 ? now_hot : now_cold[which];
                      current::run_group({&m}, x.data(), M, {m.blocks}, {y.data()});
                    }});
#ifdef BASELINE
  builds.push_back({"baseline", [&](int which, int64_t M) {
                      const Arrays& a = which < 0 ? small : arrays[which];
                      baseline_product(a, kind, which < 0 ? hot_n : N, K, x.data(), M, y.data());
                    }});
#endif
  if (callgrind) {
    for (const Build& b : builds)
      for (int64_t M : widths) b.product(0, M);
    return 0;
  }
  // One thread: the time the thread ran (other work on the machine may take the core away); more:
  // wall time.
  const bool one = omp_get_max_threads() == 1;
  auto now = [one] {
    if (!one) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
  };
  std::printf("%s q%d %lldx%lld, %d threads, %d copies\n", current::isa::NAME, kind, static_cast<long long>(N),
              static_cast<long long>(K), omp_get_max_threads(), copies);
  const size_t B = builds.size(), W = widths.size();
  std::vector<std::vector<double>> cold(B * W), hot(B * W);
  for (int rep = 0; rep < reps; ++rep)
    for (size_t i = 0; i < W; ++i)
      for (size_t k = 0; k < B; ++k) {
        const size_t b = (rep % 2 == 0) ? k : B - 1 - k;  // alternate who goes first
        double start = now();
        for (int c = 0; c < 2 * copies; ++c) builds[b].product(c % copies, widths[i]);
        cold[b * W + i].push_back((now() - start) / (2 * copies));
        builds[b].product(-1, widths[i]);
        start = now();
        for (int c = 0; c < 32; ++c) builds[b].product(-1, widths[i]);
        hot[b * W + i].push_back((now() - start) / 32 * N / hot_n);
      }
  for (size_t b = 0; b < B; ++b) {
    std::printf("%s\n", builds[b].name);
    const double cold1 = median(cold[b * W]), hot1 = median(hot[b * W]);
    for (size_t i = 0; i < W; ++i) {
      const double c = median(cold[b * W + i]), h = median(hot[b * W + i]);
      std::printf("  width %2lld: cold %8.1f us (x%.2f)  hot %8.1f us (x%.2f)", static_cast<long long>(widths[i]),
                  c * 1e6, c / cold1, h * 1e6, h / hot1);
      if (b > 0) std::printf("  this tree / baseline: cold %.3f hot %.3f", median(cold[i]) / c, median(hot[i]) / h);
      std::printf("\n");
    }
  }
  return 0;
}
#endif  // BASELINE_ONLY
