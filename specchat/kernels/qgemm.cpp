// Block-quantized linear layers for the CPU, and the decoder that runs on them.
//
// Weights keep the GGUF file's own quantization (llama.cpp's Q4_K and Q6_K blocks, repacked), so
// the target computes with exactly the weights llama.cpp reads. Activations are quantized to int8
// per row and per block of S inputs; every dot product is accumulated exactly in int32 and scaled
// in a fixed order. Each output row depends only on its own input row, through the same
// instruction sequence whatever the number of rows, so a verify pass over several positions
// reproduces single-token passes bit for bit, and speculative decoding stays exact.
//
// This file is the same for every instruction set. The vector operations come from one header of
// isa/, chosen by the SPECCHAT_ISA_* define the library is built with (one library per set):
// isa/scalar.h is plain C++ and says what each operation means lane by lane; isa/avx512.h and
// isa/avx2.h do the same operations per lane, so every variant gives the same bits, and a packed
// model is read the same way by all of them. Built with -ffp-contract=off, so the compiler fuses
// no multiply and add that the code does not fuse itself.
//
// Layout (channels in blocks of 16, one float or int32 lane per channel):
//   q4: q   [N/16][K/32][4][64] u8   group of 32 inputs: byte 64*j + 4*c + t holds input 4*j + t of
//                                     channel c in its low nibble and input 4*(j+4) + t in its high one
//       sc  [N/16][K/32][16] u8      6-bit scale of each group    w = d*sc*q - dmin*mn
//       mn  [N/16][K/32][16] u8      6-bit min of each group
//       d   [N/16][K/S][16]  fp16    super-block scales (S inputs)
//       dm  [N/16][K/S][16]  fp16
//   q8: q   [N/16][K/16][4][64] u8   group of 16 inputs, byte 64*j + 4*c + t = input 4*j + t
//       sc  [N/16][K/16][16] i8      w = d*sc*(q - offset)
//       d   [N/16][K/S][16]  fp16
//   q6: q8's values 0..63 (llama.cpp's Q6_K) in 6 bits, sc and d as q8's; per group of 32 inputs,
//       with a_j = inputs 4*j + t and b_j = inputs 16 + 4*j + t of channel c:
//       q   [N/16][K/32][4][64] u8   byte 64*j + 4*c + t: a_j in bits 0-5, b_j's top two in bits 6-7
//       qh  [N/16][K/32][2][64] u8   byte 64*h + 4*c + t: b_2h's low four bits, b_2h+1's above them
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#if defined(SPECCHAT_ISA_AVX512)
#include "isa/avx512.h"
#elif defined(SPECCHAT_ISA_AVX2)
#include "isa/avx2.h"
#elif defined(SPECCHAT_ISA_SCALAR)
#include "isa/scalar.h"
#else
#error "build with one of -DSPECCHAT_ISA_AVX512, -DSPECCHAT_ISA_AVX2, -DSPECCHAT_ISA_SCALAR"
#endif

namespace {

using namespace isa;

// One row of activations quantized to int8 per block of `block` inputs (symmetric, scale amax/127),
// with the sum of each 16-input group (the integer corrections for the weights' offsets).
struct QuantRows {
  std::vector<int8_t> q;
  std::vector<float> scale;    // [M][K/block]
  std::vector<int32_t> sum16;  // [M][K/16]
  std::vector<float> sum32;    // [M][K/32] the sum of each 32-input group, as the q4 kernel uses it
  int K, block;
};

void quantize_row(const float* row, int64_t K, int block, int8_t* qrow, float* scale, int32_t* sum16) {
  for (int64_t b = 0; b < K / block; ++b) {
    const float* xb = row + b * block;
    F16 amax = f_zero();
    for (int i = 0; i < block; i += 16) amax = f_max(amax, f_abs(f_load(xb + i)));
    const float peak = f_peak(amax);
    const F16 inv = f_set1(peak > 0.f ? 127.f / peak : 0.f);
    scale[b] = peak / 127.f;
    for (int i = 0; i < block; i += 16)  // rounds to nearest even
      sum16[(b * block + i) / 16] = quantize16(f_mul(f_load(xb + i), inv), qrow + b * block + i);
  }
}

QuantRows quantize_rows(const float* x, int64_t M, int64_t K, int block) {
  QuantRows out{std::vector<int8_t>(M * K), std::vector<float>(M * (K / block)),
                std::vector<int32_t>(M * (K / 16)), std::vector<float>(M * (K / 32)), static_cast<int>(K), block};
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      int32_t* s16 = out.sum16.data() + m * (K / 16);
      quantize_row(x + m * K, K, block, out.q.data() + m * K, out.scale.data() + m * (K / block), s16);
      for (int64_t g = 0; g < K / 32; ++g) out.sum32[m * (K / 32) + g] = static_cast<float>(s16[2 * g] + s16[2 * g + 1]);
    }
  });
  return out;
}

// Asks for the weights 32 groups ahead of `group` (8 KiB; past a channel block's end that is the
// next block, which the same thread computes next), into L2 rather than L1: the hardware
// prefetcher alone leaves the memory bus idle part of the time, and hints into L1 evict the
// activations and cost more than they save when a pass computes one row.
inline void prefetch_ahead(const uint8_t* group) {
  for (int line = 0; line < 256; line += 64) __builtin_prefetch(group + 8192 + line, 0, 2);
}

// Each row's exact int32 dot products over one group, in interleaved accumulators: two per row
// when there are few rows, so that consecutive multiply-adds do not wait on each other. Integer
// sums are exact in any order, so the result does not depend on how they are split.
template <int R>
struct RowSums {
  static constexpr int CHAINS = R <= TWO_CHAINS_UP_TO ? 2 : 1;
  I16 acc[CHAINS][R];

  RowSums() {
    for (int c = 0; c < CHAINS; ++c)
      for (int r = 0; r < R; ++r) acc[c][r] = i_zero();
  }
  // Two quads of weights below 64 (q4, q6).
  void add2(int chain, int r, const Bytes& w1, const int8_t* x1, const Bytes& w2, const int8_t* x2) {
    acc[chain % CHAINS][r] = dot8(acc[chain % CHAINS][r], w1, x1, w2, x2);
  }
  // Weights of any size (q8).
  void add_wide(int chain, int r, const Bytes& w, const int8_t* x) {
    acc[chain % CHAINS][r] = dot4_wide(acc[chain % CHAINS][r], w, x);
  }
  I16 total(int r) const { return CHAINS == 2 ? i_add(acc[0][r], acc[CHAINS - 1][r]) : acc[0][r]; }
};

// y = Σ_s xscale_s · part_s + bias for R rows of one channel block, where `group_parts(s, part)`
// accumulates super-block s's groups into part[0..R): the order every kernel scales in.
template <int R, typename GroupParts>
void scale_and_store(int64_t supers, const float* xscale, int64_t nb, float* y, int64_t ldy, const float* bias,
                     GroupParts&& group_parts) {
  F16 total[R];
  for (int r = 0; r < R; ++r) total[r] = f_zero();
  for (int64_t s = 0; s < supers; ++s) {
    F16 part[R];
    for (int r = 0; r < R; ++r) part[r] = f_zero();
    group_parts(s, part);
    for (int r = 0; r < R; ++r) {
      const float xs = xscale[r * supers + s];  // the input was quantized per super-block
      total[r] = f_fmadd(f_set1(xs), part[r], total[r]);
    }
  }
  const F16 b = bias ? f_load(bias + nb * 16) : f_zero();
  for (int r = 0; r < R; ++r) f_store(y + r * ldy + nb * 16, f_add(total[r], b));
}

struct Q4Weights {
  const uint8_t* q; const uint8_t* sc; const uint8_t* mn; const at::Half* d; const at::Half* dm;
};

// Rows [m0, m0+R) of one channel block of a q4 matrix.
template <int R>
void q4_block(const Q4Weights& w, int64_t nb, int64_t K, int S, const QuantRows& x, int64_t m0, float* y,
              int64_t ldy, const float* bias) {
  const int64_t groups = K / 32, supers = K / S, per_super = S / 32;
  const uint8_t* q = w.q + nb * groups * 256;
  const uint8_t* sc = w.sc + nb * groups * 16;
  const uint8_t* mn = w.mn + nb * groups * 16;
  const at::Half* d = w.d + nb * supers * 16;
  const at::Half* dm = w.dm + nb * supers * 16;
  const int8_t* xq = x.q.data() + m0 * K;
  const float* xsum = x.sum32.data() + m0 * groups;
  scale_and_store<R>(supers, x.scale.data() + m0 * supers, nb, y + m0 * ldy, ldy, bias, [&](int64_t s, F16* part) {
    const F16 dv = f_half(d + s * 16), dmv = f_half(dm + s * 16);
    for (int64_t g = s * per_super; g < (s + 1) * per_super; ++g) {
      const uint8_t* qg = q + g * 256;
      prefetch_ahead(qg);
      RowSums<R> sums;
      for (int j = 0; j < 4; ++j) {
        const Bytes v = b_load(qg + 64 * j);
        const Bytes lo = b_bits<0>(v, 0x0F), hi = b_bits<4>(v, 0x0F);
        for (int r = 0; r < R; ++r) {
          const int8_t* xr = xq + r * K + g * 32;
          sums.add2(j, r, lo, xr + 4 * j, hi, xr + 4 * (j + 4));
        }
      }
      const F16 scale = f_mul(dv, f_u8(sc + g * 16));
      const F16 minimum = f_mul(dmv, f_u8(mn + g * 16));
      for (int r = 0; r < R; ++r) {
        part[r] = f_fmadd(scale, f_from_i(sums.total(r)), part[r]);
        part[r] = f_fnmadd(minimum, f_set1(xsum[r * groups + g]), part[r]);
      }
    }
  });
}

struct Q8Weights {
  const uint8_t* q; const int8_t* sc; const at::Half* d; int offset;
};

template <int R>
void q8_block(const Q8Weights& w, int64_t nb, int64_t K, int S, const QuantRows& x, int64_t m0, float* y,
              int64_t ldy, const float* bias) {
  const int64_t groups = K / 16, supers = K / S, per_super = S / 16;
  const uint8_t* q = w.q + nb * groups * 256;
  const int8_t* sc = w.sc + nb * groups * 16;
  const at::Half* d = w.d + nb * supers * 16;
  const int8_t* xq = x.q.data() + m0 * K;
  const int32_t* xsum = x.sum16.data() + m0 * groups;
  scale_and_store<R>(supers, x.scale.data() + m0 * supers, nb, y + m0 * ldy, ldy, bias, [&](int64_t s, F16* part) {
    const F16 dv = f_half(d + s * 16);
    for (int64_t g = s * per_super; g < (s + 1) * per_super; ++g) {
      const uint8_t* qg = q + g * 256;
      prefetch_ahead(qg);
      RowSums<R> sums;
      for (int j = 0; j < 4; ++j) {
        const Bytes v = b_load(qg + 64 * j);
        for (int r = 0; r < R; ++r) sums.add_wide(j, r, v, xq + r * K + g * 16 + 4 * j);
      }
      const F16 scale = f_mul(dv, f_i8(sc + g * 16));
      for (int r = 0; r < R; ++r) {
        const I16 sum = i_sub(sums.total(r), w.offset * xsum[r * groups + g]);
        part[r] = f_fmadd(scale, f_from_i(sum), part[r]);
      }
    }
  });
}

struct Q6Weights {
  const uint8_t* q; const uint8_t* qh; const int8_t* sc; const at::Half* d; int offset;
};

// Rows [m0, m0+R) of one channel block of a q6 matrix. Each group of 32 inputs is two of q8_block's
// groups of 16, taken in the same order through the same float operations, so a q6 matrix gives
// bit for bit what its values give through q8_block while streaming 6.5 bits a weight, not 8.5.
template <int R>
void q6_block(const Q6Weights& w, int64_t nb, int64_t K, int S, const QuantRows& x, int64_t m0, float* y,
              int64_t ldy, const float* bias) {
  const int64_t groups = K / 32, supers = K / S, per_super = S / 32, groups16 = K / 16;
  const uint8_t* q = w.q + nb * groups * 256;
  const uint8_t* qh = w.qh + nb * groups * 128;
  const int8_t* sc = w.sc + nb * groups16 * 16;
  const at::Half* d = w.d + nb * supers * 16;
  const int8_t* xq = x.q.data() + m0 * K;
  const int32_t* xsum = x.sum16.data() + m0 * groups16;
  scale_and_store<R>(supers, x.scale.data() + m0 * supers, nb, y + m0 * ldy, ldy, bias, [&](int64_t s, F16* part) {
    const F16 dv = f_half(d + s * 16);
    for (int64_t g = s * per_super; g < (s + 1) * per_super; ++g) {
      const uint8_t* qg = q + g * 256;
      const uint8_t* hg = qh + g * 128;
      prefetch_ahead(qg);
      __builtin_prefetch(hg + 4096, 0, 2);  // as far ahead as qg's
      __builtin_prefetch(hg + 4096 + 64, 0, 2);
      Bytes w6[2][4];  // [half][quad]: a_j, then b_j
      for (int j = 0; j < 4; ++j) {
        const Bytes whole = b_load(qg + 64 * j), nibbles = b_load(hg + 64 * (j / 2));
        w6[0][j] = b_bits<0>(whole, 0x3F);
        const Bytes lower = j % 2 == 0 ? b_bits<0>(nibbles, 0x0F) : b_bits<4>(nibbles, 0x0F);
        w6[1][j] = b_or(lower, b_bits<2>(whole, 0x30));  // b_j's top bits from bits 6-7 down to 4-5
      }
      for (int half = 0; half < 2; ++half) {
        const int64_t g16 = 2 * g + half;
        RowSums<R> sums;
        for (int j = 0; j < 4; j += 2)
          for (int r = 0; r < R; ++r) {
            const int8_t* xr = xq + r * K + g16 * 16 + 4 * j;
            sums.add2(j / 2, r, w6[half][j], xr, w6[half][j + 1], xr + 4);
          }
        const F16 scale = f_mul(dv, f_i8(sc + g16 * 16));
        for (int r = 0; r < R; ++r) {
          const I16 sum = i_sub(sums.total(r), w.offset * xsum[r * groups16 + g16]);
          part[r] = f_fmadd(scale, f_from_i(sum), part[r]);
        }
      }
    }
  });
}

template <typename Fn>
void for_rows(int64_t M, Fn&& fn) {
  for (int64_t m0 = 0; m0 < M; m0 += ROW_TILE) fn(m0, std::min<int64_t>(ROW_TILE, M - m0));
}

// Rows are computed in tiles of up to ROW_TILE; a row's operations do not depend on its tile.
#define SPECCHAT_ROWS(KERNEL, n, ...)                           \
  switch (n) {                                                 \
    case 1: KERNEL<1>(__VA_ARGS__); break;                      \
    case 2: KERNEL<2>(__VA_ARGS__); break;                      \
    case 3: KERNEL<3>(__VA_ARGS__); break;                      \
    case 4: KERNEL<std::min(4, ROW_TILE)>(__VA_ARGS__); break;  \
    case 5: KERNEL<std::min(5, ROW_TILE)>(__VA_ARGS__); break;  \
    case 6: KERNEL<std::min(6, ROW_TILE)>(__VA_ARGS__); break;  \
    case 7: KERNEL<std::min(7, ROW_TILE)>(__VA_ARGS__); break;  \
    default: KERNEL<ROW_TILE>(__VA_ARGS__); break;              \
  }

// exp(x) for 16 floats: 2^(x·log2 e), with a degree-6 polynomial for the fraction (about 2 ulp).
inline F16 exp16(F16 x) {
  x = f_max(f_min(x, f_set1(88.3762626647949f)), f_set1(-87.3365478515625f));
  const F16 t = f_mul(x, f_set1(1.44269504088896341f));
  const F16 n = f_round(t);
  const F16 f = f_sub(t, n);  // in [-0.5, 0.5]
  F16 p = f_set1(1.535336188319500e-4f);
  p = f_fmadd(p, f, f_set1(1.339887440266574e-3f));
  p = f_fmadd(p, f, f_set1(9.618437357674640e-3f));
  p = f_fmadd(p, f, f_set1(5.550332471162809e-2f));
  p = f_fmadd(p, f, f_set1(2.402264791363012e-1f));
  p = f_fmadd(p, f, f_set1(6.931472028550421e-1f));
  p = f_fmadd(p, f, f_set1(1.0f));
  return f_scale2(p, n);
}

// Σ a[i]·b[i] over n (a multiple of 16) in a fixed order.
inline float dot(const float* a, const float* b, int64_t n) {
  F16 acc = f_zero();
  for (int64_t i = 0; i < n; i += 16) acc = f_fmadd(f_load(a + i), f_load(b + i), acc);
  return f_sum(acc);
}

// y += w·x over n (a multiple of 16).
inline void axpy(float w, const float* x, float* y, int64_t n) {
  const F16 vw = f_set1(w);
  for (int64_t i = 0; i < n; i += 16) f_store(y + i, f_fmadd(vw, f_load(x + i), f_load(y + i)));
}

// ---------------------------------------------------------------------------------- matrices
// One quantized weight matrix [N, K] (N padded to a multiple of 16 in the tensors).
struct QMat {
  int64_t kind;  // 4, 6 or 8
  torch::Tensor q, sc, mn, d, dm, qh;
  int64_t S, offset, N, K;
  torch::Tensor bias;  // [N16] or undefined

  QMat(int64_t kind, torch::Tensor q, torch::Tensor sc, c10::optional<torch::Tensor> mn, torch::Tensor d,
       c10::optional<torch::Tensor> dm, int64_t S, int64_t offset, int64_t N, c10::optional<torch::Tensor> bias,
       c10::optional<torch::Tensor> qh)
      : kind(kind), q(q.contiguous()), sc(sc.contiguous()), d(d.contiguous()), S(S), offset(offset), N(N) {
    TORCH_CHECK(kind == 4 || kind == 6 || kind == 8, "kind must be 4, 6 or 8");
    K = this->q.size(1) * (kind == 8 ? 16 : 32);
    TORCH_CHECK(K % S == 0 && S % (kind == 8 ? 16 : 32) == 0, "bad super-block size");
    if (kind == 6) {
      TORCH_CHECK(qh.has_value(), "q6 needs its qh array");
      this->qh = qh->contiguous();
    }
    if (kind == 4) {
      TORCH_CHECK(mn.has_value() && dm.has_value(), "q4 needs mins");
      this->mn = mn->contiguous();
      this->dm = dm->contiguous();
    }
    if (bias.has_value()) this->bias = bias->to(torch::kFloat32).contiguous();
  }
  int64_t blocks() const { return q.size(0); }

  // Rows [m0, m0+R) of channel block nb into y (leading dimension ldy, column offset col).
  void run_block(int64_t nb, const QuantRows& x, int64_t M, float* y, int64_t ldy, int64_t col) const {
    const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
    float* out = y + col;
    for_rows(M, [&](int64_t m0, int64_t rows) {
      if (kind == 4) {
        const Q4Weights w{q.data_ptr<uint8_t>(), sc.data_ptr<uint8_t>(), mn.data_ptr<uint8_t>(),
                          d.data_ptr<at::Half>(), dm.data_ptr<at::Half>()};
        SPECCHAT_ROWS(q4_block, rows, w, nb, K, static_cast<int>(S), x, m0, out, ldy, b)
      } else if (kind == 6) {
        const Q6Weights w{q.data_ptr<uint8_t>(), qh.data_ptr<uint8_t>(), sc.data_ptr<int8_t>(),
                          d.data_ptr<at::Half>(), static_cast<int>(offset)};
        SPECCHAT_ROWS(q6_block, rows, w, nb, K, static_cast<int>(S), x, m0, out, ldy, b)
      } else {
        const Q8Weights w{q.data_ptr<uint8_t>(), sc.data_ptr<int8_t>(), d.data_ptr<at::Half>(),
                          static_cast<int>(offset)};
        SPECCHAT_ROWS(q8_block, rows, w, nb, K, static_cast<int>(S), x, m0, out, ldy, b)
      }
    });
  }
};

// Several matrices reading the same input (q/k/v, gate/up), in one parallel region; each writes
// its own output [M, N16].
// `max_blocks` (> 0) computes only each matrix's first channel blocks: a draft's head over its most
// frequent ids, whose other rows are not even read.
std::vector<torch::Tensor> run_group(const std::vector<const QMat*>& mats, const float* x, int64_t M,
                                     int64_t max_blocks = 0) {
  const int64_t K = mats[0]->K;
  std::vector<QuantRows> inputs;  // one quantization per distinct super-block size
  std::vector<int> input_of(mats.size());
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < mats.size(); ++i) {
    TORCH_CHECK(mats[i]->K == K, "matrices of a group must share their input width");
    auto found = std::find(sizes.begin(), sizes.end(), mats[i]->S);
    if (found == sizes.end()) {
      sizes.push_back(mats[i]->S);
      inputs.push_back(quantize_rows(x, M, K, static_cast<int>(mats[i]->S)));
      input_of[i] = static_cast<int>(inputs.size() - 1);
    } else {
      input_of[i] = static_cast<int>(found - sizes.begin());
    }
  }
  std::vector<torch::Tensor> outs;
  std::vector<int64_t> first_block{0};
  std::vector<int64_t> blocks;
  for (const QMat* m : mats) {
    blocks.push_back(max_blocks > 0 ? std::min(max_blocks, m->blocks()) : m->blocks());
    outs.push_back(torch::empty({M, blocks.back() * 16}, torch::kFloat32));
    first_block.push_back(first_block.back() + blocks.back());
  }
  at::parallel_for(0, first_block.back(), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const size_t i = std::upper_bound(first_block.begin(), first_block.end(), b) - first_block.begin() - 1;
      mats[i]->run_block(b - first_block[i], inputs[input_of[i]], M, outs[i].data_ptr<float>(), blocks[i] * 16, 0);
    }
  });
  return outs;
}

torch::Tensor qmat_forward(const QMat& m, const torch::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == m.K, "expected input [M, ", m.K, "]");
  const torch::Tensor x = x_in.to(torch::kFloat32).contiguous();
  return run_group({&m}, x.data_ptr<float>(), x.size(0))[0];
}

// One row of the matrix, dequantized (embedding lookups read the token's row).
void dequantize_row(const QMat& m, int64_t row, float* out) {
  const int64_t nb = row / 16, c = row % 16;
  if (m.kind == 4) {
    const int64_t groups = m.K / 32, per_super = m.S / 32;
    const uint8_t* q = m.q.data_ptr<uint8_t>() + nb * groups * 256;
    const uint8_t* sc = m.sc.data_ptr<uint8_t>() + nb * groups * 16;
    const uint8_t* mn = m.mn.data_ptr<uint8_t>() + nb * groups * 16;
    const at::Half* d = m.d.data_ptr<at::Half>() + nb * (m.K / m.S) * 16;
    const at::Half* dm = m.dm.data_ptr<at::Half>() + nb * (m.K / m.S) * 16;
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = static_cast<float>(d[(g / per_super) * 16 + c]) * sc[g * 16 + c];
      const float minimum = static_cast<float>(dm[(g / per_super) * 16 + c]) * mn[g * 16 + c];
      for (int j = 0; j < 8; ++j)
        for (int t = 0; t < 4; ++t) {
          const uint8_t byte = q[g * 256 + 64 * (j % 4) + 4 * c + t];
          const int value = j < 4 ? (byte & 0x0F) : (byte >> 4);
          out[g * 32 + 4 * j + t] = scale * value - minimum;
        }
    }
  } else if (m.kind == 6) {
    const int64_t groups = m.K / 32, per_super = m.S / 16;
    const uint8_t* q = m.q.data_ptr<uint8_t>() + nb * groups * 256;
    const uint8_t* qh = m.qh.data_ptr<uint8_t>() + nb * groups * 128;
    const int8_t* sc = m.sc.data_ptr<int8_t>() + nb * groups * 32;
    const at::Half* d = m.d.data_ptr<at::Half>() + nb * (m.K / m.S) * 16;
    for (int64_t g16 = 0; g16 < 2 * groups; ++g16) {
      const int64_t g = g16 / 2;
      const float scale = static_cast<float>(d[(g16 / per_super) * 16 + c]) * sc[g16 * 16 + c];
      for (int j = 0; j < 4; ++j)
        for (int t = 0; t < 4; ++t) {
          const uint8_t whole = q[g * 256 + 64 * j + 4 * c + t];
          const uint8_t nibbles = qh[g * 128 + 64 * (j / 2) + 4 * c + t];
          const int low = (nibbles >> (4 * (j % 2))) & 0x0F;
          const int value = g16 % 2 == 0 ? (whole & 0x3F) : ((whole >> 6) << 4) | low;
          out[g16 * 16 + 4 * j + t] = scale * (value - m.offset);
        }
    }
  } else {
    const int64_t groups = m.K / 16, per_super = m.S / 16;
    const uint8_t* q = m.q.data_ptr<uint8_t>() + nb * groups * 256;
    const int8_t* sc = m.sc.data_ptr<int8_t>() + nb * groups * 16;
    const at::Half* d = m.d.data_ptr<at::Half>() + nb * (m.K / m.S) * 16;
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = static_cast<float>(d[(g / per_super) * 16 + c]) * sc[g * 16 + c];
      for (int j = 0; j < 4; ++j)
        for (int t = 0; t < 4; ++t)
          out[g * 16 + 4 * j + t] = scale * (static_cast<int>(q[g * 256 + 64 * j + 4 * c + t]) - m.offset);
    }
  }
}

// ---------------------------------------------------------------------------------- the model
// A Llama / Qwen2 decoder: RMSNorm, rotary attention with grouped K/V heads, SwiGLU MLP.
// Every per-row computation below depends on its own row only, in a fixed order, so a pass over
// L new positions produces bit for bit what L one-position passes produce.
struct Layer {
  torch::Tensor attn_norm, ffn_norm;
  std::shared_ptr<QMat> q, k, v, o, gate, up, down;
};

struct Model {
  std::vector<Layer> layers;
  std::shared_ptr<QMat> embed, head;
  torch::Tensor norm, inv_freq;
  int64_t heads, kv_heads, head_dim, hidden;
  double eps, rope_scale;

  Model(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps, torch::Tensor inv_freq, double rope_scale,
        std::shared_ptr<QMat> embed, std::shared_ptr<QMat> head, torch::Tensor norm)
      : embed(embed), head(head), norm(norm.to(torch::kFloat32).contiguous()),
        inv_freq(inv_freq.to(torch::kFloat32).contiguous()), heads(heads), kv_heads(kv_heads),
        head_dim(head_dim), hidden(embed->K), eps(eps), rope_scale(rope_scale) {}

  void add_layer(torch::Tensor attn_norm, torch::Tensor ffn_norm, std::shared_ptr<QMat> q, std::shared_ptr<QMat> k,
                 std::shared_ptr<QMat> v, std::shared_ptr<QMat> o, std::shared_ptr<QMat> gate,
                 std::shared_ptr<QMat> up, std::shared_ptr<QMat> down) {
    layers.push_back(Layer{attn_norm.to(torch::kFloat32).contiguous(), ffn_norm.to(torch::kFloat32).contiguous(),
                           q, k, v, o, gate, up, down});
  }

  void rms_norm(const float* x, const float* w, float* out, int64_t M) const {
    for (int64_t m = 0; m < M; ++m) {
      const float* r = x + m * hidden;
      const float inv = 1.f / std::sqrt(dot(r, r, hidden) / static_cast<float>(hidden) + static_cast<float>(eps));
      const F16 vinv = f_set1(inv);
      for (int64_t i = 0; i < hidden; i += 16)
        f_store(out + m * hidden + i, f_mul(f_load(w + i), f_mul(f_load(r + i), vinv)));
    }
  }

  // cos and sin of every rotary frequency at `pos` (computed once per position, shared by heads and layers).
  void rope_table(int64_t pos, float* cos_out, float* sin_out) const {
    const float* f = inv_freq.data_ptr<float>();
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const float angle = static_cast<float>(pos) * f[i];
      cos_out[i] = std::cos(angle) * static_cast<float>(rope_scale);
      sin_out[i] = std::sin(angle) * static_cast<float>(rope_scale);
    }
  }

  // Rotates one head vector in place (rotate-half convention).
  void rope(float* v, const float* c, const float* s) const {
    const int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }

  // o = Σ_p (w[p]·scale)·v_p over `seen` value rows, accumulated in order. Head widths of 4 or 8
  // registers keep the sum in registers (a store and reload per position otherwise sets the pace);
  // the multiply-adds are the same, in the same order, so the result is the same either way.
  void weigh_values(const float* w, float scale, const float* v, int64_t seen, float* o) const {
    switch (head_dim) {
      case 64: weigh_in_registers<4>(w, scale, v, seen, o); return;
      case 128: weigh_in_registers<8>(w, scale, v, seen, o); return;
      default:
        std::fill(o, o + head_dim, 0.f);
        for (int64_t p = 0; p < seen; ++p) axpy(w[p] * scale, v + p * head_dim, o, head_dim);
    }
  }

  template <int NV>
  static void weigh_in_registers(const float* w, float scale, const float* v, int64_t seen, float* o) {
    F16 acc[NV];
    for (int j = 0; j < NV; ++j) acc[j] = f_zero();
    for (int64_t p = 0; p < seen; ++p) {
      const F16 vw = f_set1(w[p] * scale);
      for (int j = 0; j < NV; ++j) acc[j] = f_fmadd(vw, f_load(v + p * NV * 16 + j * 16), acc[j]);
    }
    for (int j = 0; j < NV; ++j) f_store(o + j * 16, acc[j]);
  }

  // scores[p] = exp(scores[p] - peak) for p < seen; returns their sum, over 16 lanes in a fixed
  // order. `scores` holds whole vectors; lanes past `seen` add nothing to the sum.
  static float exponentiate(float* scores, int64_t seen, float peak) {
    const F16 vpeak = f_set1(peak);
    F16 sums = f_zero();
    for (int64_t p = 0; p < seen; p += 16) {
      const int64_t lanes = std::min<int64_t>(16, seen - p);
      std::fill(scores + p + lanes, scores + p + 16, peak);  // any finite value: its lane is dropped
      f_store(scores + p, exp16(f_sub(f_load(scores + p), vpeak)));
      std::fill(scores + p + lanes, scores + p + 16, 0.f);
      sums = f_add(sums, f_load(scores + p));
    }
    return f_sum(sums);
  }

  // out[m, h*d:(h+1)*d] = softmax(q·Kᵀ/√d) V over positions 0..past+m, one (row, head) at a time.
  void attend(const float* q, int64_t q_ld, const float* keys, const float* values, int64_t capacity, int64_t past,
              int64_t M, float* out) const {
    const int64_t groups = heads / kv_heads;
    const float scale = 1.f / std::sqrt(static_cast<float>(head_dim));
    at::parallel_for(0, M * heads, 1, [&](int64_t t0, int64_t t1) {
      std::vector<float> scores((past + M + 15) / 16 * 16);  // whole vectors
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t m = t / heads, h = t % heads, kvh = h / groups, seen = past + m + 1;
        const float* qv = q + m * q_ld + h * head_dim;
        const float* kh = keys + kvh * capacity * head_dim;
        const float* vh = values + kvh * capacity * head_dim;
        float peak = -INFINITY;
        for (int64_t p = 0; p < seen; ++p) {
          scores[p] = dot(qv, kh + p * head_dim, head_dim) * scale;
          peak = std::max(peak, scores[p]);
        }
        const float total = exponentiate(scores.data(), seen, peak);
        float* o = out + m * heads * head_dim + h * head_dim;
        weigh_values(scores.data(), 1.f / total, vh, seen, o);
      }
    });
  }

  // h[m, :hidden] += out[m, :hidden] (the residual stream; `out` is padded to whole channel blocks).
  void add_rows(const torch::Tensor& out, float* h, int64_t M) const {
    const float* o = out.data_ptr<float>();
    const int64_t ld = out.size(1);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < hidden; ++i) h[m * hidden + i] += o[m * ld + i];
  }

  // Logits [n_logits, vocab] after the new `ids`; keys/values: per layer [kv_heads, capacity, head_dim],
  // holding `past` positions, written for the new ones. `head_rows` (> 0) computes the logits of
  // the first ids only ([n_logits, head_rows]; the same values as those columns of a full pass).
  torch::Tensor forward(const torch::Tensor& ids_in, const std::vector<torch::Tensor>& keys,
                        const std::vector<torch::Tensor>& values, int64_t past, int64_t n_logits,
                        int64_t head_rows) const {
    const torch::Tensor ids = ids_in.to(torch::kInt64).contiguous();
    const int64_t M = ids.size(0), qd = heads * head_dim;
    TORCH_CHECK(head_dim % 16 == 0 && hidden % 16 == 0, "head and hidden widths must be multiples of 16");
    TORCH_CHECK(static_cast<int64_t>(keys.size()) == static_cast<int64_t>(layers.size()), "one K/V per layer");
    const int64_t capacity = keys[0].size(1);
    TORCH_CHECK(past + M <= capacity, "the K/V cache is too small");
    std::vector<float> h(M * hidden), x(M * hidden), attn(M * qd);
    const int64_t* id = ids.data_ptr<int64_t>();
    for (int64_t m = 0; m < M; ++m) dequantize_row(*embed, id[m], h.data() + m * hidden);
    std::vector<float> cos_table(M * head_dim / 2), sin_table(M * head_dim / 2);
    for (int64_t m = 0; m < M; ++m)
      rope_table(past + m, cos_table.data() + m * head_dim / 2, sin_table.data() + m * head_dim / 2);
    for (size_t li = 0; li < layers.size(); ++li) {
      const Layer& L = layers[li];
      rms_norm(h.data(), L.attn_norm.data_ptr<float>(), x.data(), M);
      auto qkv = run_group({L.q.get(), L.k.get(), L.v.get()}, x.data(), M);
      float* qp = qkv[0].data_ptr<float>();
      float* kp = qkv[1].data_ptr<float>();
      float* vp = qkv[2].data_ptr<float>();
      const int64_t q_ld = qkv[0].size(1), k_ld = qkv[1].size(1), v_ld = qkv[2].size(1);
      float* K = keys[li].data_ptr<float>();
      float* V = values[li].data_ptr<float>();
      for (int64_t m = 0; m < M; ++m) {
        const int64_t pos = past + m;
        const float* c = cos_table.data() + m * head_dim / 2;
        const float* sn = sin_table.data() + m * head_dim / 2;
        for (int64_t hd = 0; hd < heads; ++hd) rope(qp + m * q_ld + hd * head_dim, c, sn);
        for (int64_t hd = 0; hd < kv_heads; ++hd) {
          float* kr = kp + m * k_ld + hd * head_dim;
          rope(kr, c, sn);
          std::copy(kr, kr + head_dim, K + (hd * capacity + pos) * head_dim);
          const float* vr = vp + m * v_ld + hd * head_dim;
          std::copy(vr, vr + head_dim, V + (hd * capacity + pos) * head_dim);
        }
      }
      attend(qp, q_ld, K, V, capacity, past, M, attn.data());
      auto o = run_group({L.o.get()}, attn.data(), M)[0];
      add_rows(o, h.data(), M);
      rms_norm(h.data(), L.ffn_norm.data_ptr<float>(), x.data(), M);
      auto gu = run_group({L.gate.get(), L.up.get()}, x.data(), M);
      const int64_t inter = L.gate->N, g_ld = gu[0].size(1), u_ld = gu[1].size(1);
      std::vector<float> act(M * inter);
      TORCH_CHECK(inter % 16 == 0, "the MLP width must be a multiple of 16");
      const F16 one = f_set1(1.f);
      const float* gate = gu[0].data_ptr<float>();
      const float* up = gu[1].data_ptr<float>();
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < inter; i += 16) {
          const F16 g = f_load(gate + m * g_ld + i);
          const F16 u = f_load(up + m * u_ld + i);
          const F16 silu = f_div(g, f_add(one, exp16(f_sub(f_zero(), g))));
          f_store(act.data() + m * inter + i, f_mul(silu, u));
        }
      auto down = run_group({L.down.get()}, act.data(), M)[0];
      add_rows(down, h.data(), M);
    }
    const int64_t first = M - n_logits;
    rms_norm(h.data() + first * hidden, norm.data_ptr<float>(), x.data(), n_logits);
    const int64_t rows = head_rows > 0 ? std::min(head_rows, head->N) : head->N;
    auto logits = run_group({head.get()}, x.data(), n_logits, (rows + 15) / 16)[0];
    return logits.narrow(1, 0, rows);
  }
};

}  // namespace

// Each variant is its own module, and several may be loaded in one process (tests compare them):
// everything above has internal linkage and the classes are module-local, so none sees another's.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("ISA") = NAME;  // the instruction set this library was built for
  py::class_<QMat, std::shared_ptr<QMat>>(m, "QMat", py::module_local())
      .def(py::init<int64_t, torch::Tensor, torch::Tensor, c10::optional<torch::Tensor>, torch::Tensor,
                    c10::optional<torch::Tensor>, int64_t, int64_t, int64_t, c10::optional<torch::Tensor>,
                    c10::optional<torch::Tensor>>(),
           py::arg("kind"), py::arg("q"), py::arg("sc"), py::arg("mn"), py::arg("d"), py::arg("dm"), py::arg("S"),
           py::arg("offset"), py::arg("N"), py::arg("bias"), py::arg("qh") = py::none())
      .def("forward", &qmat_forward)
      .def_readonly("N", &QMat::N)
      .def_readonly("K", &QMat::K);
  py::class_<Model>(m, "Model", py::module_local())
      .def(py::init<int64_t, int64_t, int64_t, double, torch::Tensor, double, std::shared_ptr<QMat>,
                    std::shared_ptr<QMat>, torch::Tensor>())
      .def("add_layer", &Model::add_layer)
      .def("forward", &Model::forward, py::arg("ids"), py::arg("keys"), py::arg("values"), py::arg("past"),
           py::arg("n_logits"), py::arg("head_rows") = 0, py::call_guard<py::gil_scoped_release>());
}
