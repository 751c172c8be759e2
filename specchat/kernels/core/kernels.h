// The packed matrices' kernels, free of torch: activations quantized per row, the q4/q5/q6/q8 block
// kernels and the f16/f32 ones, the vector helpers the decoder shares, and run_group, which spreads
// channel blocks over threads through the `parallel_for` its includer defines (ATen's pool in
// qgemm.cpp, the test driver's own loop). The packed layout: core/layout.h; why every row is
// exact: qgemm.cpp's header.
//
// Everything here has internal linkage: each variant's library (and each driver) holds its own
// copy, so several variants loaded in one process never see each other's symbols.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/isa.h"
#include "core/layout.h"

namespace {

using namespace isa;

// Runs fn(begin', end') over pieces of [begin, end) of at least `grain`, possibly in parallel;
// defined by the includer.
template <typename Fn>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn);

// The kernels' inner steps: inlined whatever the compiler's budget, so that a tile's sums stay in
// registers instead of passing through memory at every call.
#define SPECCHAT_INLINE inline __attribute__((always_inline))

// Whether a dot unit reads QuantRows::paired (its PAIRED), rather than each row's own inputs.
template <typename D, typename = void>
struct PairedRows : std::false_type {};
template <typename D>
struct PairedRows<D, std::void_t<decltype(D::PAIRED)>> : std::bool_constant<D::PAIRED> {};

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
  // Where the dot unit of passes of 2+ rows reads rows two at a time (PairedRows: i8mm's usmmla
  // takes 8 inputs of two rows in one register): rows 2j and 2j+1 interleaved 8 inputs at a time,
  // [M/2][2K] (an odd last row paired with itself), made by pair_rows; else empty.
  std::vector<int8_t> paired;

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

// QuantRows::paired from q: once a pass, shared by every channel block.
inline void pair_rows(QuantRows& x, int64_t M) {
  const int64_t K = x.K;
  x.paired.resize((M + 1) / 2 * 2 * K);
  for (int64_t m = 0; m < M; m += 2) {
    const int8_t* a = x.q.data() + m * K;
    const int8_t* b = m + 1 < M ? a + K : a;
    int8_t* out = x.paired.data() + m * K;
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
  if (PairedRows<Dot<2>>::value && M >= 2) pair_rows(out, M);
  return out;
}

// Asks for the weights 32 groups ahead of `group` (8 KiB; past a channel block's end that is the
// next block, which the same thread computes next), into L2 rather than L1: the hardware
// prefetcher alone leaves the memory bus idle part of the time, and hints into L1 evict the
// activations and cost more than they save when a pass computes one row.
// A tile of R >= 4 rows computes long enough on each group for the group two ahead to come from
// L2 into L1 meanwhile, so it is asked for there too (docs/lab/2026-12-05-kernel-widths.md).
template <int R>
inline void prefetch_ahead(const uint8_t* group) {
  for (int line = 0; line < 256; line += 64) __builtin_prefetch(group + 8192 + line, 0, 2);
  if constexpr (R >= 4)
    for (int line = 0; line < 256; line += 64) __builtin_prefetch(group + 512 + line, 0, 3);
}

// ------------------------------------------------------------------------ the integer phase
// Every quantized kind computes, for each row r, channel c and super-block s of its inputs,
// two exact integers:
//   A = Σ_g scale[g, c] · Σ_{i in g} w[i, c]·x[r, i]     (g: the super-block's groups)
//   B = Σ_g factor[g, c] · Σ_{i in g} x[r, i]            (q4, q5: the mins; q6, q8: the scales)
// and only then turns them into floats, in one fixed order per row (see super_block_value). A
// sum of integers is the same in any order and in any grouping, so each instruction set may form
// it its own way (dpbusd into int32, maddubs pairs in int16 scaled by madd, sdot, smmla on two
// rows at once) and a row still gets the same bits whatever the width of the pass; and it is
// llama.cpp's own arithmetic for its K-quants, one float scaling per super-block and row.
// The sums fit int32 for super-blocks of up to 256 inputs (|A| < 2^30 for q8, the widest); a
// file with larger ones would wrap them modulo 2^32, the same way in every build.

// The rows of a tile as the instruction set's dot units take them (one row each, or two on
// i8mm): unit u holds rows u·ROWS .. u·ROWS + ROWS - 1, the last unit padded with the tile's
// last row (its results are never read).
template <typename D, int R>
struct Units {
  static constexpr int N = (R + D::ROWS - 1) / D::ROWS;
  const int8_t* row[N][D::ROWS];

  Units(const QuantRows& x, int64_t m0) {
    for (int u = 0; u < N; ++u)
      for (int k = 0; k < D::ROWS; ++k) {
        // Paired rows: each of a unit's pointers is its pair's (tiles start at even rows).
        const int64_t m = m0 + (PairedRows<D>::value ? u * D::ROWS : std::min(u * D::ROWS + k, R - 1));
        row[u][k] = (PairedRows<D>::value ? x.paired.data() : x.q.data()) + m * x.K;
      }
  }
};

// fn(0), fn(1), ... fn(N - 1), each index a compile-time constant (std::integral_constant): loops
// the compiler must unroll, so that a tile's sums stay in registers.
template <typename Fn, int... I>
SPECCHAT_INLINE void each_index(Fn&& fn, std::integer_sequence<int, I...>) {
  (fn(std::integral_constant<int, I>{}), ...);
}
template <int N, typename Fn>
SPECCHAT_INLINE void unrolled(Fn&& fn) {
  each_index(fn, std::make_integer_sequence<int, N>{});
}
#define SPECCHAT_STEP __attribute__((always_inline))  // on the lambdas unrolled() calls

// On the lambda each kernel hands scale_and_store (one super-block): where the instruction set
// defines it as SPECCHAT_STEP, the super-block is inlined into the loop over super-blocks, and a
// tile's sums and totals stay in registers across it instead of a call per super-block spilling
// them. AVX-512 (32 registers) gains at 8 rows; the 16-register sets lose (they spill either way,
// and inlined, in the group loop): docs/lab/2026-12-05-part-at-a-time.md.
#ifndef SPECCHAT_SUPER_BLOCK
#define SPECCHAT_SUPER_BLOCK
#endif

// Whether a pass of R rows computes one part of the channels (a register's worth) through all of a
// super-block's groups before the next part, rather than every part group by group: where the
// instruction set's Dot says so (PART_AT_A_TIME; the 256-bit x86 sets, whose 16 registers cannot
// hold both halves of a tile's sums) and the pass has 2 rows or more. Only the part's half of
// each group is then unpacked (the compiler drops the other's instructions) and its sums can stay
// in registers; a one-row pass keeps the parts interleaved, whose prefetches and two independent
// chains a memory-bound step needs (docs/lab/2026-12-05-part-at-a-time.md).
template <typename D, typename = void>
struct PartAtATime : std::false_type {};
template <typename D>
struct PartAtATime<D, std::void_t<decltype(D::PART_AT_A_TIME)>> : std::bool_constant<D::PART_AT_A_TIME> {};
// On ARM a q5 group's fifth bits leave no registers for a part's tile: the unit then says
// PART_AT_A_TIME_Q5 false, and q5 passes go through every part group by group.
template <typename D, typename = void>
struct PartAtATimeQ5 : std::true_type {};
template <typename D>
struct PartAtATimeQ5<D, std::void_t<decltype(D::PART_AT_A_TIME_Q5)>> : std::bool_constant<D::PART_AT_A_TIME_Q5> {};
template <typename D, int R, bool FIFTH = false>
constexpr int OUTER_PARTS = PartAtATime<D>::value && R >= 2 && (!FIFTH || PartAtATimeQ5<D>::value) ? D::PARTS : 1;

// Whether a dot unit's add and flush change its sums in place (IN_PLACE: i8mm's sums of two rows,
// 8 registers, which GCC copies through memory when they pass by value) rather than return them
// (neon's and the x86 units' code is better that way).
template <typename D, typename = void>
struct InPlace : std::false_type {};
template <typename D>
struct InPlace<D, std::void_t<decltype(D::IN_PLACE)>> : std::bool_constant<D::IN_PLACE> {};

// acc[u] += scale · (the products of NP pairs of quads with inputs at + 8p .. at + 8p + 7 of each
// row of unit u), for weights up to MAXW, in part OUTER of the channels when the kernel loops over
// the parts itself (OUTER_PARTS > 1), else in every part. Rows go through in sub-tiles of
// ROWS_IN_REGISTERS, and the channels in the instruction set's PARTS (a register's worth each:
// the 16 channels are one AVX-512 register, two AVX2 ones, four NEON ones), each part for every
// row of the sub-tile before the next: a row's sums then take one register, and every row reuses
// the weights the group unpacked. A Dots holds at most D::room<MAXW>() pairs before it is flushed
// (D::room_one_part<MAXW>() when one part at a time leaves registers for longer sums).
template <typename D, int MAXW, int OUTER, int NP, int N>
SPECCHAT_INLINE void add_group(typename D::Acc (&acc)[N], const typename D::Pair (&w)[NP],
                               const int8_t* const (&rows)[N][D::ROWS], int64_t at, const typename D::Scale& scale) {
  constexpr int SUB = std::max(1, ROWS_IN_REGISTERS / D::ROWS);
  constexpr int ROOM = [] {
    if constexpr (OUTER >= 0) return D::template room_one_part<MAXW>();
    else return D::template room<MAXW>();
  }();
  unrolled<(N + SUB - 1) / SUB>([&](auto tile) SPECCHAT_STEP {
    constexpr int U0 = decltype(tile)::value * SUB, UN = std::min(N, U0 + SUB) - U0;
    unrolled<(NP + ROOM - 1) / ROOM>([&](auto chunk) SPECCHAT_STEP {
      constexpr int P0 = decltype(chunk)::value * ROOM, PN = std::min(NP, P0 + ROOM) - P0;
      typename D::Dots dots[UN];
      unrolled<UN>([&](auto u) SPECCHAT_STEP { dots[u] = D::zero(); });
      unrolled<OUTER >= 0 ? 1 : D::PARTS>([&](auto part) SPECCHAT_STEP {
        constexpr int PART = OUTER >= 0 ? OUTER : decltype(part)::value;
        unrolled<PN>([&](auto p) SPECCHAT_STEP {
          unrolled<UN>([&](auto u) SPECCHAT_STEP {
            const int64_t x_at = at + 8 * (P0 + p);
            if constexpr (InPlace<D>::value) D::template add_in_place<MAXW, PART>(dots[u], w[P0 + p], rows[U0 + u], x_at);
            else dots[u] = D::template add<MAXW, PART>(dots[u], w[P0 + p], rows[U0 + u], x_at);
          });
        });
        unrolled<UN>([&](auto u) SPECCHAT_STEP {
          if constexpr (InPlace<D>::value) D::template flush_in_place<MAXW, PART>(acc[U0 + u], dots[u], scale);
          else acc[U0 + u] = D::template flush<MAXW, PART>(acc[U0 + u], dots[u], scale);
        });
      });
    });
  });
}

// fn(OUTER) for each part a kernel loops over itself (OUTER_PARTS<D, R> of them), or fn(-1) once:
// add_group then computes every part.
template <typename D, int R, bool FIFTH = false, typename Fn>
SPECCHAT_INLINE void for_outer_parts(Fn&& fn) {
  if constexpr (OUTER_PARTS<D, R, FIFTH> == 1)
    fn(std::integral_constant<int, -1>{});
  else
    unrolled<OUTER_PARTS<D, R, FIFTH>>(fn);
}

// B of R rows over `count` groups from `first` (factors of a group: 16 bytes at factor(g)), from
// each row's group sums `sums(r)`.
template <int R, typename Factors, typename Sums>
SPECCHAT_INLINE void factor_sums(I32x16 (&b)[R], int64_t first, int64_t count, Factors&& factors, Sums&& sums) {
  for (int r = 0; r < R; ++r) b[r] = i_zero();
  for (int64_t g = first; g < first + count; g += 2) {
    const Pairs p = factors(g, g + 1 < first + count);
    for (int r = 0; r < R; ++r) b[r] = p_dot(b[r], p, sums(r) + g);
  }
}

// y = Σ_s xscale_s · part_s + bias for R rows of one channel block, where `super_parts(s, part)`
// writes super-block s's value for each row into part[0..R): the order every kernel scales in.
template <int R, typename SuperParts>
void scale_and_store(int64_t supers, const float* xscale, int64_t nb, float* y, int64_t ldy, const float* bias,
                     SuperParts&& super_parts) {
  F32x16 total[R];
  for (int r = 0; r < R; ++r) total[r] = f_zero();
  for (int64_t s = 0; s < supers; ++s) {
    F32x16 part[R];
    super_parts(s, part);
    for (int r = 0; r < R; ++r) {
      const float xs = xscale[r * supers + s];  // the input was quantized per super-block
      total[r] = f_fmadd(f_set1(xs), part[r], total[r]);
    }
  }
  const F32x16 b = bias ? f_load(bias + nb * 16) : f_zero();
  for (int r = 0; r < R; ++r) f_store(y + r * ldy + nb * 16, f_add(total[r], b));
}

struct Q4Weights {
  const uint8_t* q; const uint8_t* sc; const uint8_t* mn; const uint16_t* d; const uint16_t* dm;
  const uint8_t* qh;  // q5 only: each value's fifth bit
};

// The fifth bits of a q5 group's eight quads, each moved to bit 4: byte 4*c + t of the group's
// qh holds input t of quad j of channel c in bit j.
inline void fifth_bits(const uint8_t* qh, Bytes (&high)[8]) {
  const Bytes h = b_load(qh);
  high[0] = b_bits<-4>(h, 0x10), high[1] = b_bits<-3>(h, 0x10);
  high[2] = b_bits<-2>(h, 0x10), high[3] = b_bits<-1>(h, 0x10);
  high[4] = b_bits<0>(h, 0x10), high[5] = b_bits<1>(h, 0x10);
  high[6] = b_bits<2>(h, 0x10), high[7] = b_bits<3>(h, 0x10);
}

// Rows [m0, m0+R) of one channel block of a q4 matrix, or of a q5 one (FIFTH: the values take a
// fifth bit from qh, and everything else is q4's, so both formats share one instruction order).
// Per super-block: value = d·A − dm·B, with the group scales in A and the mins in B.
template <bool FIFTH, int R>
void nibble_block(const Q4Weights& w, int64_t nb, int64_t K, int S, const QuantRows& x, int64_t m0, float* y,
                  int64_t ldy, const float* bias) {
  using D = Dot<R>;
  constexpr int MAXW = FIFTH ? 31 : 15;
  const int64_t groups = K / 32, supers = K / S, per_super = S / 32;
  const uint8_t* q = w.q + nb * groups * 256;
  const uint8_t* qh = FIFTH ? w.qh + nb * groups * 64 : nullptr;
  const uint8_t* sc = w.sc + nb * groups * 16;
  const uint8_t* mn = w.mn + nb * groups * 16;
  const uint16_t* d = w.d + nb * supers * 16;
  const uint16_t* dm = w.dm + nb * supers * 16;
  const Units<D, R> units(x, m0);
  scale_and_store<R>(supers, x.scale.data() + m0 * supers, nb, y + m0 * ldy, ldy, bias,
                     [&](int64_t s, F32x16* part) SPECCHAT_SUPER_BLOCK {
    typename D::Acc acc[Units<D, R>::N];
    for (auto& a : acc) a = D::acc_zero();
    for_outer_parts<D, R, FIFTH>([&](auto outer) SPECCHAT_STEP {
      constexpr int OUTER = decltype(outer)::value;
      for (int64_t g = s * per_super; g < (s + 1) * per_super; ++g) {
        const uint8_t* qg = q + g * 256;
        if constexpr (OUTER <= 0) prefetch_ahead<R>(qg);  // once a group
        Bytes high[8];
        if constexpr (FIFTH) {
          if constexpr (OUTER <= 0) __builtin_prefetch(qh + g * 64 + 2048, 0, 2);  // as far ahead as qg's
          fifth_bits(qh + g * 64, high);
        }
        Bytes lo[4], hi[4];  // quad j: inputs 4j + t (low nibbles), 16 + 4j + t (high nibbles)
        for (int j = 0; j < 4; ++j) {
          const Bytes v = b_load(qg + 64 * j);
          lo[j] = b_bits<0>(v, 0x0F), hi[j] = b_bits<4>(v, 0x0F);
          if constexpr (FIFTH) lo[j] = b_or(lo[j], high[j]), hi[j] = b_or(hi[j], high[j + 4]);
        }
        const typename D::Pair pairs[4] = {D::template pair<MAXW>(lo[0], lo[1]), D::template pair<MAXW>(lo[2], lo[3]),
                                           D::template pair<MAXW>(hi[0], hi[1]), D::template pair<MAXW>(hi[2], hi[3])};
        add_group<D, MAXW, OUTER>(acc, pairs, units.row, g * 32, D::scale_u8(sc + g * 16));
      }
    });
    I32x16 mins[R];
    factor_sums(mins, s * per_super, per_super,
                [&](int64_t g, bool two) { return p_u8(mn + g * 16, two ? mn + (g + 1) * 16 : nullptr); },
                [&](int r) { return x.sums32(m0 + r); });
    const F32x16 dv = f_half(d + s * 16), dmv = f_half(dm + s * 16);
    for (int r = 0; r < R; ++r)
      part[r] = f_fnmadd(dmv, f_from_i(mins[r]), f_mul(dv, f_from_i(D::row(acc[r / D::ROWS], r % D::ROWS))));
  });
}

template <int R, typename... Args>
void q4_block(Args&&... args) { nibble_block<false, R>(std::forward<Args>(args)...); }
template <int R, typename... Args>
void q5_block(Args&&... args) { nibble_block<true, R>(std::forward<Args>(args)...); }

// Per super-block of a q6 or q8 matrix: value = d·(A − offset·B), with the scales of its groups
// of 16 in both A and B.
template <int R, typename D>
SPECCHAT_INLINE void offset_parts(const typename D::Acc* acc, const I32x16 (&scaled_sums)[R], const uint16_t* d, int offset, F32x16* part) {
  const F32x16 dv = f_half(d);
  for (int r = 0; r < R; ++r)
    part[r] = f_mul(dv, f_from_i(i_sub_mul(D::row(acc[r / D::ROWS], r % D::ROWS), scaled_sums[r], offset)));
}

struct Q8Weights {
  const uint8_t* q; const int8_t* sc; const uint16_t* d; int offset;
};

template <int R>
void q8_block(const Q8Weights& w, int64_t nb, int64_t K, int S, const QuantRows& x, int64_t m0, float* y,
              int64_t ldy, const float* bias) {
  using D = Dot<R>;
  const int64_t groups = K / 16, supers = K / S, per_super = S / 16;
  const uint8_t* q = w.q + nb * groups * 256;
  const int8_t* sc = w.sc + nb * groups * 16;
  const uint16_t* d = w.d + nb * supers * 16;
  const Units<D, R> units(x, m0);
  scale_and_store<R>(supers, x.scale.data() + m0 * supers, nb, y + m0 * ldy, ldy, bias,
                     [&](int64_t s, F32x16* part) SPECCHAT_SUPER_BLOCK {
    typename D::Acc acc[Units<D, R>::N];
    for (auto& a : acc) a = D::acc_zero();
    for_outer_parts<D, R>([&](auto outer) SPECCHAT_STEP {
      constexpr int OUTER = decltype(outer)::value;
      for (int64_t g = s * per_super; g < (s + 1) * per_super; ++g) {
        const uint8_t* qg = q + g * 256;
        if constexpr (OUTER <= 0) prefetch_ahead<R>(qg);
        const typename D::Pair pairs[2] = {D::template pair<255>(b_load(qg), b_load(qg + 64)),
                                           D::template pair<255>(b_load(qg + 128), b_load(qg + 192))};
        add_group<D, 255, OUTER>(acc, pairs, units.row, g * 16, D::scale_i8(sc + g * 16));
      }
    });
    I32x16 scaled_sums[R];
    factor_sums(scaled_sums, s * per_super, per_super,
                [&](int64_t g, bool two) { return p_i8(sc + g * 16, two ? sc + (g + 1) * 16 : nullptr); },
                [&](int r) { return x.sums16(m0 + r); });
    offset_parts<R, D>(acc, scaled_sums, d + s * 16, w.offset, part);
  });
}

struct Q6Weights {
  const uint8_t* q; const uint8_t* qh; const int8_t* sc; const uint16_t* d; int offset;
};

// Rows [m0, m0+R) of one channel block of a q6 matrix. Each group of 32 inputs is two of q8_block's
// groups of 16, with the same scales and sums, so a q6 matrix gives bit for bit what its values
// give through q8_block while streaming 6.5 bits a weight, not 8.5.
template <int R>
void q6_block(const Q6Weights& w, int64_t nb, int64_t K, int S, const QuantRows& x, int64_t m0, float* y,
              int64_t ldy, const float* bias) {
  using D = Dot<R>;
  const int64_t groups = K / 32, supers = K / S, per_super = S / 32, groups16 = K / 16;
  const uint8_t* q = w.q + nb * groups * 256;
  const uint8_t* qh = w.qh + nb * groups * 128;
  const int8_t* sc = w.sc + nb * groups16 * 16;
  const uint16_t* d = w.d + nb * supers * 16;
  const Units<D, R> units(x, m0);
  scale_and_store<R>(supers, x.scale.data() + m0 * supers, nb, y + m0 * ldy, ldy, bias,
                     [&](int64_t s, F32x16* part) SPECCHAT_SUPER_BLOCK {
    typename D::Acc acc[Units<D, R>::N];
    for (auto& a : acc) a = D::acc_zero();
    for_outer_parts<D, R>([&](auto outer) SPECCHAT_STEP {
      constexpr int OUTER = decltype(outer)::value;
      for (int64_t g = s * per_super; g < (s + 1) * per_super; ++g) {
        const uint8_t* qg = q + g * 256;
        const uint8_t* hg = qh + g * 128;
        if constexpr (OUTER <= 0) {
          prefetch_ahead<R>(qg);
          __builtin_prefetch(hg + 4096, 0, 2);  // as far ahead as qg's
          __builtin_prefetch(hg + 4096 + 64, 0, 2);
        }
        Bytes w6[2][4];  // [half][quad]: a_j, then b_j
        for (int j = 0; j < 4; ++j) {
          const Bytes whole = b_load(qg + 64 * j), nibbles = b_load(hg + 64 * (j / 2));
          w6[0][j] = b_bits<0>(whole, 0x3F);
          const Bytes lower = j % 2 == 0 ? b_bits<0>(nibbles, 0x0F) : b_bits<4>(nibbles, 0x0F);
          w6[1][j] = b_or(lower, b_bits<2>(whole, 0x30));  // b_j's top bits from bits 6-7 down to 4-5
        }
        for (int half = 0; half < 2; ++half) {
          const typename D::Pair pairs[2] = {D::template pair<63>(w6[half][0], w6[half][1]),
                                             D::template pair<63>(w6[half][2], w6[half][3])};
          add_group<D, 63, OUTER>(acc, pairs, units.row, g * 32 + 16 * half, D::scale_i8(sc + (2 * g + half) * 16));
        }
      }
    });
    I32x16 scaled_sums[R];
    factor_sums(scaled_sums, s * per_super * 2, per_super * 2,
                [&](int64_t g, bool two) { return p_i8(sc + g * 16, two ? sc + (g + 1) * 16 : nullptr); },
                [&](int r) { return x.sums16(m0 + r); });
    offset_parts<R, D>(acc, scaled_sums, d + s * 16, w.offset, part);
  });
}

// Float weights (llama.cpp's F32x16, and F32 or BF16 widened exactly to F32): rows [m0, m0 + R) of
// channel block nb, each output a fixed-order float dot product of the row's float input with
// the channel's weights, so a row never depends on the others. w is [N/16][16][K].
template <bool HALF, int R>
void float_block(const uint8_t* w, int64_t nb, int64_t K, const float* x, int64_t m0, float* y, int64_t ldy,
                 const float* bias) {
  for (int c = 0; c < 16; ++c) {
    const int64_t channel = nb * 16 + c;
    F32x16 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = f_zero();
    for (int64_t k = 0; k < K; k += 16) {
      const F32x16 weights = HALF ? f_half(reinterpret_cast<const uint16_t*>(w) + channel * K + k)
                               : f_load(reinterpret_cast<const float*>(w) + channel * K + k);
      for (int r = 0; r < R; ++r) acc[r] = f_fmadd(f_load(x + (m0 + r) * K + k), weights, acc[r]);
    }
    for (int r = 0; r < R; ++r) {
      const float sum = f_sum(acc[r]);
      y[(m0 + r) * ldy + channel] = bias ? sum + bias[channel] : sum;
    }
  }
}
template <int R, typename... Args>
void f16_block(Args&&... args) { float_block<true, R>(std::forward<Args>(args)...); }
template <int R, typename... Args>
void f32_block(Args&&... args) { float_block<false, R>(std::forward<Args>(args)...); }

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

// exp(x) for 16 floats: 2^(x·log2 e), with a degree-6 polynomial for the fraction (about 2 ulp).
inline F32x16 exp16(F32x16 x) {
  x = f_max(f_min(x, f_set1(88.3762626647949f)), f_set1(-87.3365478515625f));
  const F32x16 t = f_mul(x, f_set1(1.44269504088896341f));
  const F32x16 n = f_round(t);
  const F32x16 f = f_sub(t, n);  // in [-0.5, 0.5]
  F32x16 p = f_set1(1.535336188319500e-4f);
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
  F32x16 acc = f_zero();
  for (int64_t i = 0; i < n; i += 16) acc = f_fmadd(f_load(a + i), f_load(b + i), acc);
  return f_sum(acc);
}

// y += w·x over n (a multiple of 16).
inline void axpy(float w, const float* x, float* y, int64_t n) {
  const F32x16 vw = f_set1(w);
  for (int64_t i = 0; i < n; i += 16) f_store(y + i, f_fmadd(vw, f_load(x + i), f_load(y + i)));
}
// ---------------------------------------------------------------------------------- matrices
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

// One row of the matrix, dequantized (embedding lookups read the token's row).
inline void dequantize_row(const Matrix& m, int64_t row, float* out) {
  const int64_t nb = row / 16, c = row % 16;
  if (m.kind == Kind::f16) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(m.q) + row * m.K;
    for (int64_t i = 0; i < m.K; ++i) out[i] = half_to_float(w[i]);
  } else if (m.kind == Kind::f32) {
    const float* w = reinterpret_cast<const float*>(m.q) + row * m.K;
    std::copy(w, w + m.K, out);
  } else if (has_mins(m.kind)) {  // q4, q5
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
  } else if (m.kind == Kind::q6) {
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
  } else {  // q8
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
}

}  // namespace
