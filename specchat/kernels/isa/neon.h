// The kernels' vector operations on ARM64 NEON with the dot-product extension (armv8.2-a+dotprod):
// a channel block's 16 lanes are four 128-bit quarters (channels 0-3, 4-7, 8-11, 12-15), so the
// packed layout is the same as on x86. Each lane goes through the same IEEE operations as
// isa/scalar.h describes, so the results are the scalar build's bit for bit; where a NEON
// instruction differs from x86 at the edges (min/max of NaN or signed zeros, out-of-range
// conversions) the x86 meaning is spelled out with compares and selects.
//
// Re-include contract: another instruction set's header may build on this one (isa/i8mm.h does)
// by defining, before it includes this header,
//   SPECCHAT_NEON_NAME      the variant's NAME (else "neon");
//   SPECCHAT_NEON_OWN_DOTS  this header then leaves out ROWS_IN_REGISTERS and Dot<R> (which dot
//                           unit a pass of R rows takes), which the includer defines itself;
//                           RowDot and PartDot stay, for it to build on and to take where it will.
// Everything else (the float, byte and factor operations, Pairs and p_dot) is the same for both.
#pragma once
#include <arm_neon.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if !defined(__ARM_FEATURE_DOTPROD)
#error "isa/neon.h needs the dot-product extension (-march=armv8.2-a+dotprod)"
#endif

namespace isa {

#ifndef SPECCHAT_NEON_NAME
constexpr const char* NAME = "neon";
#else
constexpr const char* NAME = SPECCHAT_NEON_NAME;  // isa/i8mm.h: these operations, its own dot products
#endif
constexpr int FLOAT_ROW_TILE = 4;  // 32 registers: 4 per row's sums, the weights and a broadcast

struct F32x16 { float32x4_t v[4]; };
struct I32x16 { int32x4_t v[4]; };
struct Bytes { uint8x16_t v[4]; };

#define SPECCHAT_NEON_EACH(OUT, EXPR) \
  OUT out;                            \
  for (int k = 0; k < 4; ++k) out.v[k] = EXPR; \
  return out;

inline F32x16 f_zero() { SPECCHAT_NEON_EACH(F32x16, vdupq_n_f32(0.f)) }
inline F32x16 f_set1(float x) { SPECCHAT_NEON_EACH(F32x16, vdupq_n_f32(x)) }
inline F32x16 f_load(const float* p) { SPECCHAT_NEON_EACH(F32x16, vld1q_f32(p + 4 * k)) }
inline void f_store(float* p, F32x16 a) {
  for (int k = 0; k < 4; ++k) vst1q_f32(p + 4 * k, a.v[k]);
}
inline F32x16 f_half(const uint16_t* p) { SPECCHAT_NEON_EACH(F32x16, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * k)))) }
inline F32x16 f_u8(const uint8_t* p) {
  const uint8x16_t b = vld1q_u8(p);
  const uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_u8(vget_high_u8(b));
  return {{vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))),
           vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)))}};
}
inline F32x16 f_i8(const int8_t* p) {
  const int8x16_t b = vld1q_s8(p);
  const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_s8(vget_high_s8(b));
  return {{vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))),
           vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)))}};
}
inline F32x16 f_from_i(I32x16 a) { SPECCHAT_NEON_EACH(F32x16, vcvtq_f32_s32(a.v[k])) }
inline F32x16 f_add(F32x16 a, F32x16 b) { SPECCHAT_NEON_EACH(F32x16, vaddq_f32(a.v[k], b.v[k])) }
inline F32x16 f_sub(F32x16 a, F32x16 b) { SPECCHAT_NEON_EACH(F32x16, vsubq_f32(a.v[k], b.v[k])) }
inline F32x16 f_mul(F32x16 a, F32x16 b) { SPECCHAT_NEON_EACH(F32x16, vmulq_f32(a.v[k], b.v[k])) }
inline F32x16 f_div(F32x16 a, F32x16 b) { SPECCHAT_NEON_EACH(F32x16, vdivq_f32(a.v[k], b.v[k])) }
// x86's min and max (the second operand unless the first is smaller / larger), not NEON's fmin and
// fmax, which return NaN for a NaN and order -0 below +0.
inline float32x4_t min4(float32x4_t a, float32x4_t b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
inline float32x4_t max4(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
inline F32x16 f_min(F32x16 a, F32x16 b) { SPECCHAT_NEON_EACH(F32x16, min4(a.v[k], b.v[k])) }
inline F32x16 f_max(F32x16 a, F32x16 b) { SPECCHAT_NEON_EACH(F32x16, max4(a.v[k], b.v[k])) }
inline F32x16 f_abs(F32x16 a) { SPECCHAT_NEON_EACH(F32x16, vabsq_f32(a.v[k])) }
inline F32x16 f_fmadd(F32x16 a, F32x16 b, F32x16 c) { SPECCHAT_NEON_EACH(F32x16, vfmaq_f32(c.v[k], a.v[k], b.v[k])) }
inline F32x16 f_fnmadd(F32x16 a, F32x16 b, F32x16 c) { SPECCHAT_NEON_EACH(F32x16, vfmsq_f32(c.v[k], a.v[k], b.v[k])) }
inline F32x16 f_round(F32x16 a) { SPECCHAT_NEON_EACH(F32x16, vrndnq_f32(a.v[k])) }  // ties to even

// 2^k for whole k in [-126, 127], from its exponent bits.
inline float32x4_t power_of_two(int32x4_t k) {
  return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k, vdupq_n_s32(127)), 23));
}
// p·2^n in two exact-then-rounded steps (see isa/scalar.h).
inline float32x4_t scale2(float32x4_t p, float32x4_t n) {
  const int32x4_t whole = vcvtq_s32_f32(n), first = vshrq_n_s32(whole, 1);  // truncates, as scalar's cast
  return vmulq_f32(vmulq_f32(p, power_of_two(first)), power_of_two(vsubq_s32(whole, first)));
}
inline F32x16 f_scale2(F32x16 p, F32x16 n) { SPECCHAT_NEON_EACH(F32x16, scale2(p.v[k], n.v[k])) }
#undef SPECCHAT_NEON_EACH

// The same fold as isa/scalar.h's: lanes i and i+8, then i and i+4, then (0+2) + (1+3).
inline float f_sum(F32x16 a) {
  const float32x4_t four = vaddq_f32(vaddq_f32(a.v[0], a.v[2]), vaddq_f32(a.v[1], a.v[3]));
  const float32x2_t two = vadd_f32(vget_low_f32(four), vget_high_f32(four));
  return vget_lane_f32(two, 0) + vget_lane_f32(two, 1);
}
// The order of AVX2's fold, with x86's max.
inline float f_peak(F32x16 a) {
  const float32x4_t four = max4(max4(a.v[0], a.v[2]), max4(a.v[1], a.v[3]));
  const float32x2_t lo = vget_low_f32(four), hi = vget_high_f32(four);
  const float32x2_t two = vbsl_f32(vcgt_f32(lo, hi), lo, hi);
  const float x = vget_lane_f32(two, 0), y = vget_lane_f32(two, 1);
  return x > y ? x : y;
}

// As cvtps2dq: to nearest (ties to even); NaN and out-of-range values give INT32_MIN, where
// NEON's conversion would saturate.
inline int32x4_t to_int32(float32x4_t x) {
  const float32x4_t r = vrndnq_f32(x);
  const uint32x4_t in_range = vandq_u32(vcgeq_f32(r, vdupq_n_f32(-2147483648.f)), vcltq_f32(r, vdupq_n_f32(2147483648.f)));
  return vbslq_s32(in_range, vcvtq_s32_f32(r), vdupq_n_s32(INT32_MIN));
}

inline int32_t quantize16(F32x16 scaled, int8_t* out) {
  int32x4_t v[4];
  for (int k = 0; k < 4; ++k) v[k] = to_int32(scaled.v[k]);
  const int16x8_t lo = vcombine_s16(vqmovn_s32(v[0]), vqmovn_s32(v[1]));
  const int16x8_t hi = vcombine_s16(vqmovn_s32(v[2]), vqmovn_s32(v[3]));
  vst1q_s8(out, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));  // saturating, as the scalar clamp
  // wrapping int32 sums, as x86's: exact modulo 2^32 in any order
  const uint32x4_t sum = vaddq_u32(vaddq_u32(vreinterpretq_u32_s32(v[0]), vreinterpretq_u32_s32(v[1])),
                                   vaddq_u32(vreinterpretq_u32_s32(v[2]), vreinterpretq_u32_s32(v[3])));
  return static_cast<int32_t>(vaddvq_u32(sum));
}

inline I32x16 i_zero() {
  I32x16 out;
  for (int k = 0; k < 4; ++k) out.v[k] = vdupq_n_s32(0);
  return out;
}
inline I32x16 i_add(I32x16 a, I32x16 b) {
  for (int k = 0; k < 4; ++k) a.v[k] = vaddq_s32(a.v[k], b.v[k]);
  return a;
}
inline I32x16 i_sub(I32x16 a, int32_t b) {
  for (int k = 0; k < 4; ++k) a.v[k] = vsubq_s32(a.v[k], vdupq_n_s32(b));
  return a;
}

inline Bytes b_load(const uint8_t* p) {
  Bytes out;
  for (int k = 0; k < 4; ++k) out.v[k] = vld1q_u8(p + 16 * k);
  return out;
}
inline Bytes b_or(Bytes a, Bytes b) {
  for (int k = 0; k < 4; ++k) a.v[k] = vorrq_u8(a.v[k], b.v[k]);
  return a;
}
template <int SHIFT>
inline Bytes b_bits(Bytes a, uint8_t mask) {
  const uint8x16_t m = vdupq_n_u8(mask);
  for (int k = 0; k < 4; ++k) {
    if constexpr (SHIFT == 0) a.v[k] = vandq_u8(a.v[k], m);
    else if constexpr (SHIFT < 0) a.v[k] = vandq_u8(vshlq_n_u8(a.v[k], -SHIFT), m);
    else a.v[k] = vandq_u8(vshrq_n_u8(a.v[k], SHIFT), m);
  }
  return a;
}

// ---------------------------------------------------------------- the integer phase
// sdot multiplies signed bytes: weights below 128 read the same as signed ones; weights up to
// 255 go in as w − 128 (the byte with its top bit flipped), and 128·Σx is added back at flush.
struct RowDot {
  static constexpr int ROWS = 1;
  static constexpr int PARTS = 4;  // channels 0-3, 4-7, 8-11, 12-15
  struct Octet { int8x16_t a[4], b[4]; };
  struct Dots { int32x4_t v[4]; int32x4_t inputs; };  // inputs: Σx of the octets (wide weights only)
  struct Scale { int32x4_t v[4]; };
  using Acc = I32x16;

  template <int MAXW>
  static Octet octet(const Bytes& a, const Bytes& b) {
    Octet out;
    const uint8x16_t flip = vdupq_n_u8(MAXW > 127 ? 0x80 : 0);
    for (int k = 0; k < 4; ++k) {
      out.a[k] = vreinterpretq_s8_u8(veorq_u8(a.v[k], flip));
      out.b[k] = vreinterpretq_s8_u8(veorq_u8(b.v[k], flip));
    }
    return out;
  }
  template <int MAXW>
  static constexpr int room() { return 1 << 20; }
  static Dots zero() {
    Dots d;
    for (int k = 0; k < 4; ++k) d.v[k] = vdupq_n_s32(0);
    d.inputs = vdupq_n_s32(0);
    return d;
  }
  // EVERY_PART: each part's adds sum the inputs (PartDot's parts start from zero one at a time),
  // not only part 0's.
  template <int MAXW, int PART, bool EVERY_PART = false>
  static void add_to(Dots& d, const Octet& w, const int8_t* const* rows, int64_t at) {
    const int8x8_t x = vld1_s8(rows[0] + at);
    d.v[PART] = vdotq_lane_s32(vdotq_lane_s32(d.v[PART], w.a[PART], x, 0), w.b[PART], x, 1);
    if constexpr (MAXW > 127 && (PART == 0 || EVERY_PART))
      d.inputs = vdotq_s32(d.inputs, vdupq_n_s8(1), vcombine_s8(x, vdup_n_s8(0)));
  }
  template <int MAXW, int PART>
  static Dots add(Dots d, const Octet& w, const int8_t* const* rows, int64_t at) {
    add_to<MAXW, PART>(d, w, rows, at);
    return d;
  }
  static Scale scale_of(int16x8_t lo, int16x8_t hi) {
    return {{vmovl_s16(vget_low_s16(lo)), vmovl_s16(vget_high_s16(lo)), vmovl_s16(vget_low_s16(hi)),
             vmovl_s16(vget_high_s16(hi))}};
  }
  static Scale scale_u8(const uint8_t* p) {
    const uint8x16_t v = vld1q_u8(p);
    return scale_of(vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(v))), vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(v))));
  }
  static Scale scale_i8(const int8_t* p) {
    const int8x16_t v = vld1q_s8(p);
    return scale_of(vmovl_s8(vget_low_s8(v)), vmovl_s8(vget_high_s8(v)));
  }
  static Acc acc_zero() { return i_zero(); }
  // (Wide weights: the inputs' sums come from part 0's adds, which precede every part's flush;
  // PartDot's from each part's own.)
  template <int MAXW, int PART>
  static void flush_to(Acc& a, const Dots& d, const Scale& s) {
    a.v[PART] = vmlaq_s32(a.v[PART], d.v[PART], s.v[PART]);
    if constexpr (MAXW > 127) a.v[PART] = vmlaq_s32(a.v[PART], s.v[PART], vdupq_n_s32(128 * vaddvq_s32(d.inputs)));
  }
  template <int MAXW, int PART>
  static Acc flush(Acc a, const Dots& d, const Scale& s) {
    flush_to<MAXW, PART>(a, d, s);
    return a;
  }
  static I32x16 row(const Acc& a, int) { return a; }
};

// Passes of 4 rows or more: RowDot a part (4 channels) at a time through a super-block, its sums
// changed in place (core/blocks.h). Eight rows' sums of all 16 channels would fill all 32
// registers; a part's take 8. Each part's adds start from zero, so each sums the inputs itself.
struct PartDot : RowDot {
  static constexpr bool PART_AT_A_TIME = true;
  static constexpr bool PART_AT_A_TIME_Q5 = false;  // q5's fifth bits would then spill
  template <int MAXW>
  static constexpr int room_one_part() { return room<MAXW>(); }
  static constexpr bool IN_PLACE = true;
  template <int MAXW, int PART>
  static void add_in_place(Dots& d, const Octet& w, const int8_t* const* rows, int64_t at) {
    add_to<MAXW, PART, true>(d, w, rows, at);
  }
  template <int MAXW, int PART>
  static void flush_in_place(Acc& a, const Dots& d, const Scale& s) {
    flush_to<MAXW, PART>(a, d, s);
  }
};

#ifndef SPECCHAT_NEON_OWN_DOTS
constexpr int ROWS_IN_REGISTERS = 8;  // one register a row, in each quarter of the block in turn
template <int R>
using Dot = std::conditional_t<(R >= 4), PartDot, RowDot>;
#endif

inline int32_t load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

struct Pairs { int32x4_t a[4], b[4]; };
inline Pairs p_u8(const uint8_t* a, const uint8_t* b) {
  const RowDot::Scale sa = RowDot::scale_u8(a);
  const RowDot::Scale sb = b ? RowDot::scale_u8(b) : RowDot::Scale{{vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)}};
  Pairs p;
  for (int k = 0; k < 4; ++k) p.a[k] = sa.v[k], p.b[k] = sb.v[k];
  return p;
}
inline Pairs p_i8(const int8_t* a, const int8_t* b) {
  const RowDot::Scale sa = RowDot::scale_i8(a);
  const RowDot::Scale sb = b ? RowDot::scale_i8(b) : RowDot::Scale{{vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)}};
  Pairs p;
  for (int k = 0; k < 4; ++k) p.a[k] = sa.v[k], p.b[k] = sb.v[k];
  return p;
}
inline I32x16 p_dot(I32x16 acc, const Pairs& p, const int16_t* sums) {
  for (int k = 0; k < 4; ++k) acc.v[k] = vmlaq_n_s32(vmlaq_n_s32(acc.v[k], p.a[k], sums[0]), p.b[k], sums[1]);
  return acc;
}
inline I32x16 i_sub_mul(I32x16 a, const I32x16& b, int32_t k) {
  for (int q = 0; q < 4; ++q) a.v[q] = vmlsq_n_s32(a.v[q], b.v[q], k);
  return a;
}

}  // namespace isa
