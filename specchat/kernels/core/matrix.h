// Phase three of a product, the matrix driver: Matrix (one packed weight matrix, core/layout.h),
// whose run_block picks a block kernel (core/blocks.h) and tiles a pass's rows for it; run_group,
// which quantizes the input once per super-block size (core/quant.h) and spreads the channel
// blocks of several matrices over threads through the includer's `parallel_for`; and
// dequantize_row, the embedding lookup. The decoder (core/decoder.h) calls these.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/blocks.h"
#include "core/layout.h"
#include "core/quant.h"

namespace {

using namespace isa;

// Quantized kinds take up to 8 rows per pass over a channel block's weights (in sub-tiles of the
// instruction set's ROWS_IN_REGISTERS, which share each group's unpacked weights); the float kinds,
// which keep a whole row's sums in registers, FLOAT_ROW_TILE.
constexpr int ROW_TILE = 8;

template <typename Fn>
void for_rows(int64_t M, int64_t tile, Fn&& fn) {
  for (int64_t m0 = 0; m0 < M; m0 += tile) fn(m0, std::min<int64_t>(tile, M - m0));
}

// A tile of n rows (at most TILE); a row's operations do not depend on its tile.
#define SPECCHAT_ROWS(KERNEL, TILE, n, ...)                 \
  switch (n) {                                             \
    case 1: KERNEL<1>(__VA_ARGS__); break;                  \
    case 2: KERNEL<std::min(2, TILE)>(__VA_ARGS__); break;  \
    case 3: KERNEL<std::min(3, TILE)>(__VA_ARGS__); break;  \
    case 4: KERNEL<std::min(4, TILE)>(__VA_ARGS__); break;  \
    case 5: KERNEL<std::min(5, TILE)>(__VA_ARGS__); break;  \
    case 6: KERNEL<std::min(6, TILE)>(__VA_ARGS__); break;  \
    case 7: KERNEL<std::min(7, TILE)>(__VA_ARGS__); break;  \
    default: KERNEL<std::min(8, TILE)>(__VA_ARGS__); break; \
  }

// One weight matrix [N, K]: pointers to its packed arrays (core/layout.h; N padded to whole channel
// blocks of 16); sc is unsigned for q4 and q5, signed for q6 and q8; the float kinds have only q.
struct Matrix {
  Kind kind;  // the float kinds (f16, f32) read the float input
  const uint8_t* q;
  const uint8_t* sc;
  const uint8_t* mn;  // q4, q5
  const uint16_t* d;  // fp16
  const uint16_t* dm; // q4, q5
  const uint8_t* qh;  // q5: the fifth bits; q6: the low bits of half the values
  int64_t S, offset, N, K, blocks;
  const float* bias;  // [blocks * 16] or null

  const int8_t* signed_sc() const { return reinterpret_cast<const int8_t*>(sc); }

  bool is_float() const { return is_float_kind(kind); }

  // Rows [0, M) of channel block nb into y (leading dimension ldy), from the quantized input x
  // (or, for the float kinds, the float input xf [M, K]).
  void run_block(int64_t nb, const QuantRows& x, const float* xf, int64_t M, float* y, int64_t ldy) const {
    const int block_size = static_cast<int>(S);
    if (is_float()) {
      for_rows(M, FLOAT_ROW_TILE, [&](int64_t m0, int64_t rows) {
        if (kind == Kind::f16) {
          SPECCHAT_ROWS(f16_block, FLOAT_ROW_TILE, rows, q, nb, K, xf, m0, y, ldy, bias)
        } else {
          SPECCHAT_ROWS(f32_block, FLOAT_ROW_TILE, rows, q, nb, K, xf, m0, y, ldy, bias)
        }
      });
      return;
    }
    for_rows(M, ROW_TILE, [&](int64_t m0, int64_t rows) {
      switch (kind) {
        case Kind::q4: {
          const Q4Weights w{q, sc, mn, d, dm, nullptr};
          SPECCHAT_ROWS(q4_block, ROW_TILE, rows, w, nb, K, block_size, x, m0, y, ldy, bias)
          break;
        }
        case Kind::q5: {
          const Q4Weights w{q, sc, mn, d, dm, qh};
          SPECCHAT_ROWS(q5_block, ROW_TILE, rows, w, nb, K, block_size, x, m0, y, ldy, bias)
          break;
        }
        case Kind::q6: {
          const Q6Weights w{q, qh, signed_sc(), d, static_cast<int>(offset)};
          SPECCHAT_ROWS(q6_block, ROW_TILE, rows, w, nb, K, block_size, x, m0, y, ldy, bias)
          break;
        }
        case Kind::q8: {
          const Q8Weights w{q, signed_sc(), d, static_cast<int>(offset)};
          SPECCHAT_ROWS(q8_block, ROW_TILE, rows, w, nb, K, block_size, x, m0, y, ldy, bias)
          break;
        }
        case Kind::f16:
        case Kind::f32:
          break;  // computed above
      }
    });
  }
};

// How many channel blocks run_group computes of each matrix: all, or the first `max_blocks` (> 0):
// a draft's head over its most frequent ids, whose other rows are not even read.
inline std::vector<int64_t> group_blocks(const std::vector<const Matrix*>& mats, int64_t max_blocks = 0) {
  std::vector<int64_t> blocks;
  for (const Matrix* m : mats) blocks.push_back(max_blocks > 0 ? std::min(max_blocks, m->blocks) : m->blocks);
  return blocks;
}

// Several matrices reading the same input x [M, K] (q/k/v, gate/up; they must share K), in one
// parallel region; matrix i writes outs[i] [M, blocks[i] * 16].
inline void run_group(const std::vector<const Matrix*>& mats, const float* x, int64_t M,
                      const std::vector<int64_t>& blocks, const std::vector<float*>& outs) {
  const int64_t K = mats[0]->K;
  std::vector<QuantRows> inputs(1);  // one quantization per distinct super-block size (the first: none)
  std::vector<int> input_of(mats.size(), 0);
  std::vector<int64_t> sizes{0};
  for (size_t i = 0; i < mats.size(); ++i) {
    if (mats[i]->is_float()) continue;  // reads x itself
    auto found = std::find(sizes.begin(), sizes.end(), mats[i]->S);
    if (found == sizes.end()) {
      sizes.push_back(mats[i]->S);
      inputs.push_back(quantize_rows(x, M, K, static_cast<int>(mats[i]->S)));
      input_of[i] = static_cast<int>(inputs.size() - 1);
    } else {
      input_of[i] = static_cast<int>(found - sizes.begin());
    }
  }
  std::vector<int64_t> first_block{0};
  for (int64_t b : blocks) first_block.push_back(first_block.back() + b);
  parallel_for(0, first_block.back(), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const size_t i = std::upper_bound(first_block.begin(), first_block.end(), b) - first_block.begin() - 1;
      mats[i]->run_block(b - first_block[i], inputs[input_of[i]], x, M, outs[i], blocks[i] * 16);
    }
  });
}

// Row c of channel block nb of a q4 or q5 matrix (q5: each value's fifth bit from qh).
inline void dequantize_nibbles(const Matrix& m, int64_t nb, int64_t c, float* out) {
  const int64_t groups = m.K / 32, per_super = m.S / 32;
  const uint8_t* q = m.q + nb * groups * 256;
  const uint8_t* sc = m.sc + nb * groups * 16;
  const uint8_t* mn = m.mn + nb * groups * 16;
  const uint16_t* d = m.d + nb * (m.K / m.S) * 16;
  const uint16_t* dm = m.dm + nb * (m.K / m.S) * 16;
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = half_to_float(d[(g / per_super) * 16 + c]) * sc[g * 16 + c];
    const float minimum = half_to_float(dm[(g / per_super) * 16 + c]) * mn[g * 16 + c];
    for (int j = 0; j < 8; ++j)
      for (int t = 0; t < 4; ++t) {
        const uint8_t byte = q[g * 256 + 64 * (j % 4) + 4 * c + t];
        const int fifth = m.kind == Kind::q5 ? ((m.qh[(nb * groups + g) * 64 + 4 * c + t] >> j) & 1) << 4 : 0;
        const int value = (j < 4 ? (byte & 0x0F) : (byte >> 4)) | fifth;
        out[g * 32 + 4 * j + t] = scale * value - minimum;
      }
  }
}

// Row c of channel block nb of a q6 matrix.
inline void dequantize_q6(const Matrix& m, int64_t nb, int64_t c, float* out) {
  const int64_t groups = m.K / 32, per_super = m.S / 16;
  const uint8_t* q = m.q + nb * groups * 256;
  const uint8_t* qh = m.qh + nb * groups * 128;
  const int8_t* sc = m.signed_sc() + nb * groups * 32;
  const uint16_t* d = m.d + nb * (m.K / m.S) * 16;
  for (int64_t g16 = 0; g16 < 2 * groups; ++g16) {
    const int64_t g = g16 / 2;
    const float scale = half_to_float(d[(g16 / per_super) * 16 + c]) * sc[g16 * 16 + c];
    for (int j = 0; j < 4; ++j)
      for (int t = 0; t < 4; ++t) {
        const uint8_t whole = q[g * 256 + 64 * j + 4 * c + t];
        const uint8_t nibbles = qh[g * 128 + 64 * (j / 2) + 4 * c + t];
        const int low = (nibbles >> (4 * (j % 2))) & 0x0F;
        const int value = g16 % 2 == 0 ? (whole & 0x3F) : ((whole >> 6) << 4) | low;
        out[g16 * 16 + 4 * j + t] = scale * (value - m.offset);
      }
  }
}

// Row c of channel block nb of a q8 matrix.
inline void dequantize_q8(const Matrix& m, int64_t nb, int64_t c, float* out) {
  const int64_t groups = m.K / 16, per_super = m.S / 16;
  const uint8_t* q = m.q + nb * groups * 256;
  const int8_t* sc = m.signed_sc() + nb * groups * 16;
  const uint16_t* d = m.d + nb * (m.K / m.S) * 16;
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = half_to_float(d[(g / per_super) * 16 + c]) * sc[g * 16 + c];
    for (int j = 0; j < 4; ++j)
      for (int t = 0; t < 4; ++t)
        out[g * 16 + 4 * j + t] = scale * (static_cast<int>(q[g * 256 + 64 * j + 4 * c + t]) - m.offset);
  }
}

// One row of the matrix, dequantized (embedding lookups read the token's row).
inline void dequantize_row(const Matrix& m, int64_t row, float* out) {
  const int64_t nb = row / 16, c = row % 16;
  switch (m.kind) {
    case Kind::f16: {
      const uint16_t* w = reinterpret_cast<const uint16_t*>(m.q) + row * m.K;
      for (int64_t i = 0; i < m.K; ++i) out[i] = half_to_float(w[i]);
      break;
    }
    case Kind::f32: {
      const float* w = reinterpret_cast<const float*>(m.q) + row * m.K;
      std::copy(w, w + m.K, out);
      break;
    }
    case Kind::q4:
    case Kind::q5:
      dequantize_nibbles(m, nb, c, out);
      break;
    case Kind::q6:
      dequantize_q6(m, nb, c, out);
      break;
    case Kind::q8:
      dequantize_q8(m, nb, c, out);
      break;
  }
}

}  // namespace
