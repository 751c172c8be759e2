// One product of a random packed matrix, for counting the instructions a kernel build executes
// (scripts/lab/arm_counts.py runs it under qemu):
//
//   instruction_count KIND M REPS N
//
// computes the N-channel × 1536-input matrix of KIND (4, 5, 6, 8) against M rows, REPS times.
// Counts of (N=128, REPS 2) − (N=128, REPS 1) − (N=64, REPS 2) + (N=64, REPS 1) leave the
// instructions of one 64-channel product alone: no data generation, no row quantization (which a
// real matrix shares over thousands of channels).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/kernels.h"

namespace {
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t, const Fn& fn) {
  if (begin < end) fn(begin, end);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  const int kind = std::atoi(argv[1]);
  const int64_t M = std::atoll(argv[2]), N = std::atoll(argv[4]), K = 1536, blocks = N / 16;
  const int reps = std::atoi(argv[3]);
  std::mt19937 rng(1);
  const bool nib = kind == 4 || kind == 5;
  const int group = kind == 8 ? 16 : 32;
  std::vector<uint8_t> q(blocks * (K / group) * 256), sc(blocks * (K / (nib ? 32 : 16)) * 16),
      mn(blocks * (K / 32) * 16), qh(blocks * (K / 32) * 128);
  std::vector<uint16_t> d(blocks * (K / 256) * 16, 0x1400), dm(blocks * (K / 256) * 16, 0x1400);
  for (auto* v : {&q, &sc, &mn, &qh})
    for (auto& b : *v) b = static_cast<uint8_t>(rng() % (v == &sc || v == &mn ? 64 : 256));
  const Matrix m{static_cast<Kind>(kind), q.data(), sc.data(), nib ? mn.data() : nullptr, d.data(),
                 nib ? dm.data() : nullptr, kind == 5 || kind == 6 ? qh.data() : nullptr, 256,
                 kind == 8 ? 128 : kind == 6 ? 32 : 0, N, K, blocks, nullptr};
  std::vector<float> x(M * K), y(M * N);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 1000.f;
  for (int r = 0; r < reps; ++r) run_group({&m}, x.data(), M, {blocks}, {y.data()});
  volatile float kept = y[0];  // the products must not be optimized away
  (void)kept;
  return 0;
}
