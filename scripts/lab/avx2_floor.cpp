// The floor of the AVX2 q4 kernel's inner loop: the instructions of one part (8 channels) of one
// group (32 inputs) for R rows, as isa/avx2.h issues them in a pass of 2 rows or more, in a loop
// with the weights and inputs in L1 and nothing else (no scales, minimums, prefetches or stores).
// What the kernel takes beyond this is scheduling; what this takes is the instruction mix.
//
//   g++ -O3 -mavx2 -mfma -std=c++17 scripts/lab/avx2_floor.cpp -o avx2_floor && ./avx2_floor
//
// Modes: "kernel" broadcasts each quad of a row's inputs (vpbroadcastd from memory, as the
// kernel); "no input loads" uses one register per row instead (wrong sums, a bound: what the
// loads of the inputs cost); "128-bit loads" broadcasts 16 bytes (vbroadcasti128) instead of 4.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

alignas(64) uint8_t weights[128 * 256];
alignas(64) int8_t inputs[8][8192];

enum Mode { KERNEL, NO_INPUT_LOADS, LOADS_128 };

template <int R, Mode MODE>
__attribute__((noinline)) void run(long iterations, __m256i* out) {
  const __m256i low = _mm256_set1_epi8(0x0F), scale = _mm256_set1_epi32(0x00030003);
  __m256i acc[R], own[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256(), own[r] = _mm256_set1_epi8(static_cast<char>(r + 1));
  for (long i = 0; i < iterations; ++i) {
    const uint8_t* group = weights + (i & 127) * 256;
    const long at = (i & 127) * 32;
    __m256i w[8];  // quads 0-3 (low nibbles), 4-7 (high nibbles) of 8 channels
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 64 * j));
      w[j] = _mm256_and_si256(v, low);
      w[4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    for (int r = 0; r < R; ++r) {
      __m256i sums = _mm256_setzero_si256();
      for (int q = 0; q < 8; ++q) {
        __m256i x;
        if constexpr (MODE == NO_INPUT_LOADS) {
          x = own[r];
        } else if constexpr (MODE == LOADS_128) {
          x = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(&inputs[r][(at * 4 + 16 * q) & 8191])));
        } else {
          int32_t quad;
          std::memcpy(&quad, &inputs[r][at + 4 * q], 4);
          x = _mm256_set1_epi32(quad);
        }
        sums = _mm256_add_epi16(sums, _mm256_maddubs_epi16(w[q], x));
      }
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(sums, scale));
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

template <int R, Mode MODE>
void time_it(const char* name) {
  __m256i out[8];
  run<R, MODE>(1000, out);
  const long iterations = 2000000;
  const auto start = std::chrono::steady_clock::now();
  run<R, MODE>(iterations, out);
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / iterations;
  volatile int sink = _mm256_extract_epi32(out[0], 0);
  (void)sink;
  std::printf("%-15s R=%d: %5.2f ns a part-iteration, %5.2f ns a group-row (both parts)\n", name, R, ns, 2 * ns / R);
}

}  // namespace

int main() {
  for (auto& b : weights) b = 0x37;
  for (auto& row : inputs)
    for (auto& b : row) b = 3;
  time_it<4, KERNEL>("kernel");
  time_it<8, KERNEL>("kernel");
  time_it<4, NO_INPUT_LOADS>("no input loads");
  time_it<8, NO_INPUT_LOADS>("no input loads");
  time_it<4, LOADS_128>("128-bit loads");
  time_it<8, LOADS_128>("128-bit loads");
}
