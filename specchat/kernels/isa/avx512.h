// The kernels' vector operations on AVX-512 VNNI: one 512-bit register holds one value of each of
// a channel block's 16 channels. See isa/scalar.h for what each operation means, lane by lane.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace isa {

constexpr const char* NAME = "avx512";
constexpr int ROWS_IN_REGISTERS = 8;  // 2 registers a row (the group's sums, the super-block's)
constexpr int FLOAT_ROW_TILE = 8;
#define SPECCHAT_SUPER_BLOCK SPECCHAT_STEP  // a super-block inlined: see core/blocks.h

struct F32x16 { __m512 v; };
struct I32x16 { __m512i v; };
struct Bytes { __m512i v; };

inline F32x16 f_zero() { return {_mm512_setzero_ps()}; }
inline F32x16 f_set1(float x) { return {_mm512_set1_ps(x)}; }
inline F32x16 f_load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void f_store(float* p, F32x16 a) { _mm512_storeu_ps(p, a.v); }
inline F32x16 f_half(const uint16_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline F32x16 f_u8(const uint8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline F32x16 f_i8(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline F32x16 f_from_i(I32x16 a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline F32x16 f_add(F32x16 a, F32x16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F32x16 f_sub(F32x16 a, F32x16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline F32x16 f_mul(F32x16 a, F32x16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F32x16 f_div(F32x16 a, F32x16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline F32x16 f_min(F32x16 a, F32x16 b) { return {_mm512_min_ps(a.v, b.v)}; }
inline F32x16 f_max(F32x16 a, F32x16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline F32x16 f_abs(F32x16 a) { return {_mm512_abs_ps(a.v)}; }
inline F32x16 f_fmadd(F32x16 a, F32x16 b, F32x16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline F32x16 f_fnmadd(F32x16 a, F32x16 b, F32x16 c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }
inline F32x16 f_round(F32x16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline F32x16 f_scale2(F32x16 p, F32x16 n) { return {_mm512_scalef_ps(p.v, n.v)}; }

inline float f_sum(F32x16 a) {
  const __m256 lo = _mm512_castps512_ps256(a.v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1));
  const __m256 eight = _mm256_add_ps(lo, hi);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}
inline float f_peak(F32x16 a) { return _mm512_reduce_max_ps(a.v); }

inline int32_t quantize16(F32x16 scaled, int8_t* out) {
  const __m512i v = _mm512_cvtps_epi32(scaled.v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtsepi32_epi8(v));
  return _mm512_reduce_add_epi32(v);
}

inline I32x16 i_zero() { return {_mm512_setzero_si512()}; }
inline I32x16 i_add(I32x16 a, I32x16 b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline I32x16 i_sub(I32x16 a, int32_t b) { return {_mm512_sub_epi32(a.v, _mm512_set1_epi32(b))}; }

inline Bytes b_load(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
inline Bytes b_or(Bytes a, Bytes b) { return {_mm512_or_si512(a.v, b.v)}; }
template <int SHIFT>
inline Bytes b_bits(Bytes a, uint8_t mask) {
  // In 16-bit lanes: bits crossing into the neighbouring byte are outside the mask.
  __m512i shifted = a.v;
  if constexpr (SHIFT > 0) shifted = _mm512_srli_epi16(a.v, SHIFT);
  if constexpr (SHIFT < 0) shifted = _mm512_slli_epi16(a.v, -SHIFT);
  return {_mm512_and_si512(shifted, _mm512_set1_epi8(static_cast<char>(mask)))};
}

inline int32_t load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// ---------------------------------------------------------------- the integer phase
// dpbusd multiplies unsigned weights by signed inputs into int32 directly: any weight up to 255,
// so every kind takes the same path.
struct RowDot {
  static constexpr int ROWS = 1;
  static constexpr int PARTS = 1;
  struct Octet { __m512i a, b; };
  struct Dots { __m512i v; };
  struct Scale { __m512i v; };
  using Acc = I32x16;

  template <int MAXW>
  static Octet octet(const Bytes& a, const Bytes& b) { return {a.v, b.v}; }
  template <int MAXW>
  static constexpr int room() { return 1 << 20; }
  static Dots zero() { return {_mm512_setzero_si512()}; }
  template <int MAXW, int PART>
  static Dots add(Dots d, const Octet& w, const int8_t* const* rows, int64_t at) {
    const int8_t* x = rows[0] + at;
    d.v = _mm512_dpbusd_epi32(d.v, w.a, _mm512_set1_epi32(load32(x)));
    return {_mm512_dpbusd_epi32(d.v, w.b, _mm512_set1_epi32(load32(x + 4)))};
  }
  static Scale scale_u8(const uint8_t* p) {
    return {_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
  }
  static Scale scale_i8(const int8_t* p) {
    return {_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
  }
  static Acc acc_zero() { return i_zero(); }
  template <int MAXW, int PART>
  static Acc flush(Acc a, const Dots& d, const Scale& s) { return {_mm512_add_epi32(a.v, _mm512_mullo_epi32(d.v, s.v))}; }
  static I32x16 row(const Acc& a, int) { return a; }
};
template <int R>
using Dot = RowDot;

// Two groups' factors as 16-bit pairs, one pair per channel's 32-bit lane (dpwssd's operand).
struct Pairs { __m512i v; };
inline Pairs pairs_of(__m128i a, __m128i b, bool is_signed) {
  const __m256i both = _mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b));
  return {is_signed ? _mm512_cvtepi8_epi16(both) : _mm512_cvtepu8_epi16(both)};
}
inline __m128i load16(const void* p) { return p ? _mm_loadu_si128(static_cast<const __m128i*>(p)) : _mm_setzero_si128(); }
inline Pairs p_u8(const uint8_t* a, const uint8_t* b) { return pairs_of(load16(a), load16(b), false); }
inline Pairs p_i8(const int8_t* a, const int8_t* b) { return pairs_of(load16(a), load16(b), true); }
inline I32x16 p_dot(I32x16 acc, const Pairs& p, const int16_t* sums) {
  return {_mm512_dpwssd_epi32(acc.v, p.v, _mm512_set1_epi32(load32(sums)))};
}
inline I32x16 i_sub_mul(I32x16 a, const I32x16& b, int32_t k) {
  return {_mm512_sub_epi32(a.v, _mm512_mullo_epi32(b.v, _mm512_set1_epi32(k)))};
}

}  // namespace isa
