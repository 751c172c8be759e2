// The kernels' vector operations on AVX2 with FMA and F16C: a channel block's 16 lanes are two
// 256-bit halves (channels 0-7, then 8-15), so the packed layout is the same as AVX-512's.
// Each lane goes through the same IEEE operations as isa/scalar.h describes, so the results are
// AVX-512's bit for bit.
//
// Re-include contract: another instruction set's header may build on this one (isa/avxvnni.h
// does) by defining, before it includes this header,
//   SPECCHAT_AVX2_NAME      the variant's NAME (else "avx2");
//   SPECCHAT_AVX2_OWN_DOTS  this header then leaves out its integer phase (ROWS_IN_REGISTERS,
//                           RowDot and Dot<R>, below), which the includer defines itself.
// Everything else (the float, byte and factor operations, Pairs and p_dot) is the same for both.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace isa {

#ifndef SPECCHAT_AVX2_NAME
constexpr const char* NAME = "avx2";
#else
constexpr const char* NAME = SPECCHAT_AVX2_NAME;  // isa/avxvnni.h: these operations, its own dot products
#endif
constexpr int FLOAT_ROW_TILE = 4;  // 16 registers: 2 per row's sums, the weights and a broadcast

struct F32x16 { __m256 lo, hi; };
struct I32x16 { __m256i lo, hi; };
struct Bytes { __m256i lo, hi; };

inline F32x16 f_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F32x16 f_set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F32x16 f_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void f_store(float* p, F32x16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
inline F32x16 f_half(const uint16_t* p) {
  const __m128i* h = reinterpret_cast<const __m128i*>(p);
  return {_mm256_cvtph_ps(_mm_loadu_si128(h)), _mm256_cvtph_ps(_mm_loadu_si128(h + 1))};
}
inline __m128i load8(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
inline F32x16 f_u8(const uint8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(p))), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(p + 8)))};
}
inline F32x16 f_i8(const int8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(p))), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(p + 8)))};
}
inline F32x16 f_from_i(I32x16 a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }

#define SPECCHAT_AVX2_EACH(NAME, OP) \
  inline F32x16 NAME(F32x16 a, F32x16 b) { return {OP(a.lo, b.lo), OP(a.hi, b.hi)}; }
SPECCHAT_AVX2_EACH(f_add, _mm256_add_ps)
SPECCHAT_AVX2_EACH(f_sub, _mm256_sub_ps)
SPECCHAT_AVX2_EACH(f_mul, _mm256_mul_ps)
SPECCHAT_AVX2_EACH(f_div, _mm256_div_ps)
SPECCHAT_AVX2_EACH(f_min, _mm256_min_ps)
SPECCHAT_AVX2_EACH(f_max, _mm256_max_ps)
#undef SPECCHAT_AVX2_EACH

inline F32x16 f_abs(F32x16 a) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  return {_mm256_andnot_ps(sign, a.lo), _mm256_andnot_ps(sign, a.hi)};
}
inline F32x16 f_fmadd(F32x16 a, F32x16 b, F32x16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline F32x16 f_fnmadd(F32x16 a, F32x16 b, F32x16 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline F32x16 f_round(F32x16 a) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, mode), _mm256_round_ps(a.hi, mode)};
}

// 2^k for whole k in [-126, 127], from its exponent bits.
inline __m256 power_of_two(__m256i k) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23)); }

// p·2^n in two exact-then-rounded steps (see isa/scalar.h): scalef's result, subnormals included.
inline __m256 scale2(__m256 p, __m256 n) {
  const __m256i whole = _mm256_cvttps_epi32(n), first = _mm256_srai_epi32(whole, 1);
  const __m256i second = _mm256_sub_epi32(whole, first);
  return _mm256_mul_ps(_mm256_mul_ps(p, power_of_two(first)), power_of_two(second));
}
inline F32x16 f_scale2(F32x16 p, F32x16 n) { return {scale2(p.lo, n.lo), scale2(p.hi, n.hi)}; }

inline float f_sum(F32x16 a) {
  const __m256 eight = _mm256_add_ps(a.lo, a.hi);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}
inline float f_peak(F32x16 a) {
  const __m256 eight = _mm256_max_ps(a.lo, a.hi);
  const __m128 four = _mm_max_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_max_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_max_ss(two, _mm_shuffle_ps(two, two, 1)));
}

inline int32_t quantize16(F32x16 scaled, int8_t* out) {
  const __m256i lo = _mm256_cvtps_epi32(scaled.lo), hi = _mm256_cvtps_epi32(scaled.hi);
  // packs saturate (int32 -> int16 -> int8) but interleave 128-bit lanes; the permute undoes that
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
  const __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), bytes);
  const __m256i eight = _mm256_add_epi32(lo, hi);
  __m128i four = _mm_add_epi32(_mm256_castsi256_si128(eight), _mm256_extracti128_si256(eight, 1));
  four = _mm_add_epi32(four, _mm_shuffle_epi32(four, 0x4E));
  four = _mm_add_epi32(four, _mm_shuffle_epi32(four, 0xB1));
  return _mm_cvtsi128_si32(four);
}

inline I32x16 i_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline I32x16 i_add(I32x16 a, I32x16 b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline I32x16 i_sub(I32x16 a, int32_t b) {
  const __m256i v = _mm256_set1_epi32(b);
  return {_mm256_sub_epi32(a.lo, v), _mm256_sub_epi32(a.hi, v)};
}

inline Bytes b_load(const uint8_t* p) {
  const __m256i* v = reinterpret_cast<const __m256i*>(p);
  return {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
}
inline Bytes b_or(Bytes a, Bytes b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
template <int SHIFT>
inline Bytes b_bits(Bytes a, uint8_t mask) {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(mask));
  if constexpr (SHIFT == 0)
    return {_mm256_and_si256(a.lo, m), _mm256_and_si256(a.hi, m)};
  else if constexpr (SHIFT < 0)  // in 16-bit lanes: bits crossing into the neighbouring byte are outside the mask
    return {_mm256_and_si256(_mm256_slli_epi16(a.lo, -SHIFT), m), _mm256_and_si256(_mm256_slli_epi16(a.hi, -SHIFT), m)};
  else
    return {_mm256_and_si256(_mm256_srli_epi16(a.lo, SHIFT), m), _mm256_and_si256(_mm256_srli_epi16(a.hi, SHIFT), m)};
}

inline int32_t load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Two groups' factors as 16-bit pairs, one pair per channel's 32-bit lane (channels 0-7, 8-15).
struct Pairs { __m256i lo, hi; };
inline __m128i load16(const void* p) { return p ? _mm_loadu_si128(static_cast<const __m128i*>(p)) : _mm_setzero_si128(); }
inline Pairs p_u8(const uint8_t* a, const uint8_t* b) {
  const __m128i va = load16(a), vb = load16(b);
  return {_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(va, vb)), _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(va, vb))};
}
inline Pairs p_i8(const int8_t* a, const int8_t* b) {
  const __m128i va = load16(a), vb = load16(b);
  return {_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(va, vb)), _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(va, vb))};
}
inline I32x16 p_dot(I32x16 acc, const Pairs& p, const int16_t* sums) {
  const __m256i s = _mm256_set1_epi32(load32(sums));
  return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(p.lo, s)), _mm256_add_epi32(acc.hi, _mm256_madd_epi16(p.hi, s))};
}
inline I32x16 i_sub_mul(I32x16 a, const I32x16& b, int32_t k) {
  const __m256i v = _mm256_set1_epi32(k);
  return {_mm256_sub_epi32(a.lo, _mm256_mullo_epi32(b.lo, v)), _mm256_sub_epi32(a.hi, _mm256_mullo_epi32(b.hi, v))};
}

#ifndef SPECCHAT_AVX2_OWN_DOTS
// ---------------------------------------------------------------- the integer phase
// maddubs forms each pair of products in int16, and madd then multiplies the pairs by the
// group's scale into int32: the scaling costs nothing beyond the madd that would widen them
// anyway. Weights up to 255 are split into nibbles, whose pairs fit, and the high nibbles' sums
// are weighted by 16 in their madd.
constexpr int ROWS_IN_REGISTERS = 4;  // each row's sums in one register, half of the block at a time

struct RowDot {
  static constexpr int ROWS = 1;
  static constexpr int PARTS = 2;  // channels 0-7, then 8-15
  struct Octet { __m256i a_lo, a_hi, b_lo, b_hi, a4_lo, a4_hi, b4_lo, b4_hi; };  // *4: high nibbles (wide)
  struct Dots { __m256i lo, hi, lo4, hi4; };
  struct Scale { __m256i lo, hi; };  // (s, s) in each channel's 32-bit lane
  using Acc = I32x16;

  template <int MAXW>
  static Octet octet(const Bytes& a, const Bytes& b) {
    if constexpr (MAXW <= 63) {
      const __m256i none = _mm256_setzero_si256();
      return {a.lo, a.hi, b.lo, b.hi, none, none, none, none};
    } else {
      const __m256i low = _mm256_set1_epi8(0x0F);
      auto high = [&low](__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), low); };
      return {_mm256_and_si256(a.lo, low), _mm256_and_si256(a.hi, low), _mm256_and_si256(b.lo, low),
              _mm256_and_si256(b.hi, low), high(a.lo),  high(a.hi),  high(b.lo),  high(b.hi)};
    }
  }
  // Each octet is flushed at once: its two maddubs add two pair sums of at most 2·w·128 each
  // to a 16-bit lane, which 32767 holds for weights (or nibbles) up to 63. Adding up to four
  // octets in 16 bits first (as room for q4 allows) was slower with the parts interleaved: the
  // longer-lived sums take registers that 16 do not have to spare (the levers tried in
  // docs/lab/2026-12-05-kernel-widths.md).
  template <int MAXW>
  static constexpr int room() {
    static_assert(2 * 2 * (MAXW > 63 ? 15 : MAXW) * 128 <= 32767);
    return 1;
  }
  // One part at a time (passes of 2 rows or more, core/blocks.h) leaves the registers for as
  // many octets as a 16-bit lane holds (q4's whole group): fewer madds and 32-bit adds a row.
  static constexpr bool PART_AT_A_TIME = true;
  template <int MAXW>
  static constexpr int room_one_part() { return 32767 / (2 * 2 * (MAXW > 63 ? 15 : MAXW) * 128); }
  // acc + pairs of a·xa + pairs of b·xb, in 16-bit lanes.
  static __m256i chain(__m256i acc, __m256i a, __m256i xa, __m256i b, __m256i xb) {
    acc = _mm256_add_epi16(_mm256_add_epi16(acc, _mm256_maddubs_epi16(a, xa)), _mm256_maddubs_epi16(b, xb));
    // Each row's sums stay one chain in the order written: GCC otherwise rebalances a tile's
    // sums into trees whose leaves are all live at once, more than 16 registers hold.
    asm("" : "+x"(acc));
    return acc;
  }
  static Dots zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()}; }
  template <int MAXW, int PART>
  static Dots add(Dots d, const Octet& w, const int8_t* const* rows, int64_t at) {
    // Broadcast for this part alone: shared by both parts, the broadcasts of a tile would not fit
    // in registers and would go through memory (hiding the pointer keeps GCC from sharing them).
    const int8_t* x = rows[0] + at;
    asm("" : "+r"(x));
    const __m256i xa = _mm256_set1_epi32(load32(x)), xb = _mm256_set1_epi32(load32(x + 4));
    if constexpr (PART == 0) {
      d.lo = chain(d.lo, w.a_lo, xa, w.b_lo, xb);
      if constexpr (MAXW > 63) d.lo4 = chain(d.lo4, w.a4_lo, xa, w.b4_lo, xb);
    } else {
      d.hi = chain(d.hi, w.a_hi, xa, w.b_hi, xb);
      if constexpr (MAXW > 63) d.hi4 = chain(d.hi4, w.a4_hi, xa, w.b4_hi, xb);
    }
    return d;
  }
  static Scale scale_of(__m256i lo, __m256i hi) {
    auto twice = [](__m256i v) {  // s in both 16-bit halves of its lane
      return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
    };
    return {twice(lo), twice(hi)};
  }
  static Scale scale_u8(const uint8_t* p) {
    return scale_of(_mm256_cvtepu8_epi32(load8(p)), _mm256_cvtepu8_epi32(load8(p + 8)));
  }
  static Scale scale_i8(const int8_t* p) {
    return scale_of(_mm256_cvtepi8_epi32(load8(p)), _mm256_cvtepi8_epi32(load8(p + 8)));
  }
  static Acc acc_zero() { return i_zero(); }
  template <int MAXW, int PART>
  static Acc flush(Acc a, const Dots& d, const Scale& s) {
    __m256i& out = PART == 0 ? a.lo : a.hi;
    const __m256i sums = PART == 0 ? d.lo : d.hi, scale = PART == 0 ? s.lo : s.hi;
    out = _mm256_add_epi32(out, _mm256_madd_epi16(sums, scale));
    if constexpr (MAXW > 63)  // 16·s: at most 2048 in magnitude, still a 16-bit factor
      out = _mm256_add_epi32(out, _mm256_madd_epi16(PART == 0 ? d.lo4 : d.hi4, _mm256_slli_epi16(scale, 4)));
    return a;
  }
  static I32x16 row(const Acc& a, int) { return a; }
};
template <int R>
using Dot = RowDot;
#endif

}  // namespace isa
