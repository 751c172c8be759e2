// Phase two of a product: the block kernels. Each computes rows [m0, m0 + R) of one channel block
// (16 output channels) of a packed matrix, for a tile of R <= 8 rows: nibble_block (q4, q5),
// q6_block and q8_block from the quantized rows (core/quant.h), float_block (f16, f32) from the
// float input. The instruction set's dot unit (isa/*.h's Dot<R>) forms the exact integer sums;
// add_group and the helpers here order its steps, so that a tile's sums stay in registers. The
// driver (core/matrix.h) picks the kernel and the tile. Words (quad, octet, part, unit, ...):
// core/kernels.h.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/quant.h"

namespace {

using namespace isa;

// The kernels' inner steps: inlined whatever the compiler's budget, so that a tile's sums stay in
// registers instead of passing through memory at every call.
#define SPECCHAT_INLINE inline __attribute__((always_inline))

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

// ---------------------------------------------------------------------------- the integer phase
// Every quantized kind computes, for each row r, channel c and super-block s of its inputs,
// two exact integers:
//   A = Σ_g scale[g, c] · Σ_{i in g} w[i, c]·x[r, i]     (g: the super-block's groups)
//   B = Σ_g factor[g, c] · Σ_{i in g} x[r, i]            (q4, q5: the mins; q6, q8: the scales)
// and only then turns them into floats, in one fixed order per row (see scale_and_store). A
// sum of integers is the same in any order and in any grouping, so each instruction set may form
// it its own way (dpbusd into int32, maddubs pairs in int16 scaled by madd, sdot, usmmla on two
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
        // Interleaved rows: each of a unit's pointers is to its two rows' copy (tiles start at even rows).
        const int64_t m = m0 + (ReadsInterleaved<D>::value ? u * D::ROWS : std::min(u * D::ROWS + k, R - 1));
        row[u][k] = (ReadsInterleaved<D>::value ? x.interleaved.data() : x.q.data()) + m * x.K;
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

// acc[u] += scale · (the products of OCTETS octets w[o] with inputs at + 8o .. at + 8o + 7 of each
// row of unit u), for weights up to MAXW, in part OUTER of the channels when the kernel loops over
// the parts itself (OUTER_PARTS > 1), else in every part. Rows go through in sub-tiles of
// ROWS_IN_REGISTERS, and the channels in the instruction set's PARTS (a register's worth each:
// the 16 channels are one AVX-512 register, two AVX2 ones, four NEON ones), each part for every
// row of the sub-tile before the next: a row's sums then take one register, and every row reuses
// the weights the group unpacked. A Dots holds at most D::room<MAXW>() octets before it is flushed
// (D::room_one_part<MAXW>() when one part at a time leaves registers for longer sums).
template <typename D, int MAXW, int OUTER, int OCTETS, int N>
SPECCHAT_INLINE void add_group(typename D::Acc (&acc)[N], const typename D::Octet (&w)[OCTETS],
                               const int8_t* const (&rows)[N][D::ROWS], int64_t at, const typename D::Scale& scale) {
  constexpr int SUB = std::max(1, ROWS_IN_REGISTERS / D::ROWS);
  constexpr int ROOM = [] {
    if constexpr (OUTER >= 0) return D::template room_one_part<MAXW>();
    else return D::template room<MAXW>();
  }();
  unrolled<(N + SUB - 1) / SUB>([&](auto tile) SPECCHAT_STEP {
    constexpr int U0 = decltype(tile)::value * SUB, UN = std::min(N, U0 + SUB) - U0;
    unrolled<(OCTETS + ROOM - 1) / ROOM>([&](auto chunk) SPECCHAT_STEP {
      constexpr int O0 = decltype(chunk)::value * ROOM, ON = std::min(OCTETS, O0 + ROOM) - O0;
      typename D::Dots dots[UN];
      unrolled<UN>([&](auto u) SPECCHAT_STEP { dots[u] = D::zero(); });
      unrolled<OUTER >= 0 ? 1 : D::PARTS>([&](auto part) SPECCHAT_STEP {
        constexpr int PART = OUTER >= 0 ? OUTER : decltype(part)::value;
        unrolled<ON>([&](auto o) SPECCHAT_STEP {
          unrolled<UN>([&](auto u) SPECCHAT_STEP {
            const int64_t x_at = at + 8 * (O0 + o);
            if constexpr (InPlace<D>::value) D::template add_in_place<MAXW, PART>(dots[u], w[O0 + o], rows[U0 + u], x_at);
            else dots[u] = D::template add<MAXW, PART>(dots[u], w[O0 + o], rows[U0 + u], x_at);
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
        const typename D::Octet octets[4] = {D::template octet<MAXW>(lo[0], lo[1]), D::template octet<MAXW>(lo[2], lo[3]),
                                             D::template octet<MAXW>(hi[0], hi[1]), D::template octet<MAXW>(hi[2], hi[3])};
        add_group<D, MAXW, OUTER>(acc, octets, units.row, g * 32, D::scale_u8(sc + g * 16));
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
        const typename D::Octet octets[2] = {D::template octet<255>(b_load(qg), b_load(qg + 64)),
                                             D::template octet<255>(b_load(qg + 128), b_load(qg + 192))};
        add_group<D, 255, OUTER>(acc, octets, units.row, g * 16, D::scale_i8(sc + g * 16));
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
          const typename D::Octet octets[2] = {D::template octet<63>(w6[half][0], w6[half][1]),
                                               D::template octet<63>(w6[half][2], w6[half][3])};
          add_group<D, 63, OUTER>(acc, octets, units.row, g * 32 + 16 * half, D::scale_i8(sc + (2 * g + half) * 16));
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

}  // namespace
