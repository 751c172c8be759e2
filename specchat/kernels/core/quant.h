// Phase one of a product: the input rows quantized to int8 (QuantRows), once a pass and shared by
// every matrix of a group with the same super-block size, and for i8mm's dot units interleaved
// two rows at a time. The block kernels (core/blocks.h) read them; the driver (core/matrix.h)
// makes them. Words (quad, octet, group, ...): core/kernels.h.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/isa.h"

namespace {

using namespace isa;

// Runs fn(begin', end') over pieces of [begin, end) of at least `grain`, possibly in parallel;
// defined by the includer.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn);

// Whether a dot unit reads QuantRows::interleaved (its INTERLEAVED), rather than each row's own inputs.
template <typename D, typename = void>
struct ReadsInterleaved : std::false_type {};
template <typename D>
struct ReadsInterleaved<D, std::void_t<decltype(D::INTERLEAVED)>> : std::bool_constant<D::INTERLEAVED> {};

// Rows of activations quantized to int8 per block of `block` inputs (symmetric, scale amax/127),
// with the sum of each 16 and each 32 inputs (the integer corrections for the weights' offsets
// and minimums). The sums are 16-bit (a block of 32 int8 sums to at most 4096 in magnitude) and
// each row's end two past its last group: isa's p_dot reads them two at a time.
struct QuantRows {
  std::vector<int8_t> q;
  std::vector<float> scale;    // [M][K/block]
  std::vector<int16_t> sum16;  // [M][K/16 + 2]
  std::vector<int16_t> sum32;  // [M][K/32 + 2]
  int64_t K;
  int block;
  // Where the dot unit of passes of 2+ rows reads rows two at a time (ReadsInterleaved: i8mm's
  // usmmla takes an octet of two rows in one register): rows 2j and 2j+1 interleaved an octet at a
  // time, [M/2][2K] (an odd last row interleaved with itself), made by interleave_rows; else empty.
  std::vector<int8_t> interleaved;

  const int16_t* sums16(int64_t m) const { return sum16.data() + m * (K / 16 + 2); }
  const int16_t* sums32(int64_t m) const { return sum32.data() + m * (K / 32 + 2); }
};

void quantize_row(const float* row, int64_t K, int block, int8_t* qrow, float* scale, int16_t* sum16,
                  int16_t* sum32) {
  for (int64_t b = 0; b < K / block; ++b) {
    const float* xb = row + b * block;
    F32x16 amax = f_zero();
    for (int i = 0; i < block; i += 16) amax = f_max(amax, f_abs(f_load(xb + i)));
    const float peak = f_peak(amax);
    const F32x16 inv = f_set1(peak > 0.f ? 127.f / peak : 0.f);
    scale[b] = peak / 127.f;
    for (int i = 0; i < block; i += 16)  // rounds to nearest even
      sum16[(b * block + i) / 16] = static_cast<int16_t>(quantize16(f_mul(f_load(xb + i), inv), qrow + b * block + i));
  }
  for (int64_t g = 0; g < K / 32; ++g) sum32[g] = static_cast<int16_t>(sum16[2 * g] + sum16[2 * g + 1]);
}

// QuantRows::interleaved from q: once a pass, shared by every channel block.
inline void interleave_rows(QuantRows& x, int64_t M) {
  const int64_t K = x.K;
  x.interleaved.resize((M + 1) / 2 * 2 * K);
  for (int64_t m = 0; m < M; m += 2) {
    const int8_t* a = x.q.data() + m * K;
    const int8_t* b = m + 1 < M ? a + K : a;
    int8_t* out = x.interleaved.data() + m * K;
    for (int64_t i = 0; i < K; i += 8, out += 16) {
      std::memcpy(out, a + i, 8);
      std::memcpy(out + 8, b + i, 8);
    }
  }
}

QuantRows quantize_rows(const float* x, int64_t M, int64_t K, int block) {
  QuantRows out{std::vector<int8_t>(M * K), std::vector<float>(M * (K / block)),
                std::vector<int16_t>(M * (K / 16 + 2)), std::vector<int16_t>(M * (K / 32 + 2)), K, block};
  parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      quantize_row(x + m * K, K, block, out.q.data() + m * K, out.scale.data() + m * (K / block),
                   out.sum16.data() + m * (K / 16 + 2), out.sum32.data() + m * (K / 32 + 2));
  });
  if (ReadsInterleaved<Dot<2>>::value && M >= 2) interleave_rows(out, M);
  return out;
}

}  // namespace
