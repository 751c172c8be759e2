// ARM64 with the int8 matrix multiply (armv8.6-a+i8mm: Apple M2 and later, Graviton 3 and 4,
// Neoverse V1/V2/N2, Cortex-X2/A710 and later): isa/neon.h's operations, and for passes of two
// rows or more, dot products that take two rows at once. usmmla multiplies a 2×8 block of
// unsigned weights (two channels, eight inputs) by a 2×8 block of signed inputs (two rows, the
// same eight inputs) into a 2×2 block of int32 sums, so one instruction does the work of two
// sdot: exactly the shape of a verify pass. A one-row pass keeps neon's sdot, which wastes
// nothing on a second row. The integer sums are exact either way, so each row gets the bits of
// every other build.
#pragma once

// isa/neon.h's operations and dot units under this variant's name, without its choice of unit
// (its re-include contract): this header defines ROWS_IN_REGISTERS and Dot<R> below.
#define SPECCHAT_NEON_NAME "i8mm"
#define SPECCHAT_NEON_OWN_DOTS
#include "isa/neon.h"

#include <type_traits>

#if !defined(__ARM_FEATURE_MATMUL_INT8)
#error "isa/i8mm.h needs the int8 matrix multiply (-march=armv8.6-a+i8mm)"
#endif

namespace isa {

struct TwoRowDot {
  static constexpr int ROWS = 2;
  static constexpr int PARTS = 4;  // channels 0-3, 4-7, 8-11, 12-15
  // Lane layout: register m holds channels 2m and 2m+1, an octet each (its first quad, then its
  // second), as usmmla's first operand reads them.
  struct Octet { uint8x16_t v[8]; };
  // Register m: [channel 2m · row 0, channel 2m · row 1, channel 2m+1 · row 0, channel 2m+1 · row 1].
  struct Dots { int32x4_t v[8]; };
  struct Scale { int32x4_t v[8]; };  // each channel's scale in its two lanes
  using Acc = Dots;

  template <int MAXW>  // usmmla takes weights up to 255 as they are
  static Octet octet(const Bytes& a, const Bytes& b) {
    Octet out;
    for (int k = 0; k < 4; ++k) {
      const uint32x4_t qa = vreinterpretq_u32_u8(a.v[k]), qb = vreinterpretq_u32_u8(b.v[k]);
      out.v[2 * k] = vreinterpretq_u8_u32(vzip1q_u32(qa, qb));
      out.v[2 * k + 1] = vreinterpretq_u8_u32(vzip2q_u32(qa, qb));
    }
    return out;
  }
  template <int MAXW>
  static constexpr int room() { return 1 << 20; }
  static constexpr bool IN_PLACE = true;  // add and flush change their sums in place
  static constexpr bool INTERLEAVED = true;  // reads QuantRows::interleaved: one load a unit and octet
  static Dots zero() {
    Dots d;
    for (auto& v : d.v) v = vdupq_n_s32(0);
    return d;
  }
  template <int MAXW, int PART>
  static void add_in_place(Dots& d, const Octet& w, const int8_t* const* rows, int64_t at) {
    const int8x16_t x = vld1q_s8(rows[0] + 2 * at);  // the unit's two rows, 8 inputs each
    d.v[2 * PART] = vusmmlaq_s32(d.v[2 * PART], w.v[2 * PART], x);
    d.v[2 * PART + 1] = vusmmlaq_s32(d.v[2 * PART + 1], w.v[2 * PART + 1], x);
  }
  static Scale spread(const RowDot::Scale& s) {
    Scale out;
    for (int k = 0; k < 4; ++k) out.v[2 * k] = vzip1q_s32(s.v[k], s.v[k]), out.v[2 * k + 1] = vzip2q_s32(s.v[k], s.v[k]);
    return out;
  }
  static Scale scale_u8(const uint8_t* p) { return spread(RowDot::scale_u8(p)); }
  static Scale scale_i8(const int8_t* p) { return spread(RowDot::scale_i8(p)); }
  static Acc acc_zero() { return zero(); }
  template <int MAXW, int PART>
  static void flush_in_place(Acc& a, const Dots& d, const Scale& s) {
    for (int m = 2 * PART; m < 2 * PART + 2; ++m) a.v[m] = vmlaq_s32(a.v[m], d.v[m], s.v[m]);
  }
  // Row k's sums, channels in order.
  static I32x16 row(const Acc& a, int k) {
    I32x16 out;
    for (int q = 0; q < 4; ++q)
      out.v[q] = k == 0 ? vuzp1q_s32(a.v[2 * q], a.v[2 * q + 1]) : vuzp2q_s32(a.v[2 * q], a.v[2 * q + 1]);
    return out;
  }
};

// Passes of 4 rows or more: a part (4 channels) at a time through a super-block (core/blocks.h),
// so that the sums of 4 units (8 rows) take 8 registers instead of 32 and stay there; but not
// q5's, whose fifth bits would then spill (more instructions than group by group).
struct PartTwoRowDot : TwoRowDot {
  static constexpr bool PART_AT_A_TIME = true;
  static constexpr bool PART_AT_A_TIME_Q5 = false;
  template <int MAXW>
  static constexpr int room_one_part() { return room<MAXW>(); }
};

constexpr int ROWS_IN_REGISTERS = 8;  // 2 registers a unit of two rows, in each quarter of the block in turn
template <int R>
using Dot = std::conditional_t<(R >= 4), PartTwoRowDot, std::conditional_t<(R >= 2), TwoRowDot, RowDot>>;

}  // namespace isa
