// The kernels' vector operations on AVX2 with FMA and F16C: a channel block's 16 lanes are two
// 256-bit halves (channels 0-7, then 8-15), so the packed layout is the same as AVX-512's.
// Each lane goes through the same IEEE operations as isa/scalar.h describes, so the results are
// AVX-512's bit for bit.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace isa {

constexpr const char* NAME = "avx2";
constexpr int ROW_TILE = 4;          // 16 registers: 2 per row's sums, the weights and a broadcast
constexpr int TWO_CHAINS_UP_TO = 2;

struct F16 { __m256 lo, hi; };
struct I16 { __m256i lo, hi; };
struct Bytes { __m256i lo, hi; };

inline F16 f_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F16 f_set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline F16 f_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void f_store(float* p, F16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
inline F16 f_half(const uint16_t* p) {
  const __m128i* h = reinterpret_cast<const __m128i*>(p);
  return {_mm256_cvtph_ps(_mm_loadu_si128(h)), _mm256_cvtph_ps(_mm_loadu_si128(h + 1))};
}
inline __m128i load8(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
inline F16 f_u8(const uint8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(p))), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(p + 8)))};
}
inline F16 f_i8(const int8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(p))), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load8(p + 8)))};
}
inline F16 f_from_i(I16 a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }

#define SPECCHAT_AVX2_EACH(NAME, OP) \
  inline F16 NAME(F16 a, F16 b) { return {OP(a.lo, b.lo), OP(a.hi, b.hi)}; }
SPECCHAT_AVX2_EACH(f_add, _mm256_add_ps)
SPECCHAT_AVX2_EACH(f_sub, _mm256_sub_ps)
SPECCHAT_AVX2_EACH(f_mul, _mm256_mul_ps)
SPECCHAT_AVX2_EACH(f_div, _mm256_div_ps)
SPECCHAT_AVX2_EACH(f_min, _mm256_min_ps)
SPECCHAT_AVX2_EACH(f_max, _mm256_max_ps)
#undef SPECCHAT_AVX2_EACH

inline F16 f_abs(F16 a) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  return {_mm256_andnot_ps(sign, a.lo), _mm256_andnot_ps(sign, a.hi)};
}
inline F16 f_fmadd(F16 a, F16 b, F16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline F16 f_fnmadd(F16 a, F16 b, F16 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline F16 f_round(F16 a) {
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
inline F16 f_scale2(F16 p, F16 n) { return {scale2(p.lo, n.lo), scale2(p.hi, n.hi)}; }

inline float f_sum(F16 a) {
  const __m256 eight = _mm256_add_ps(a.lo, a.hi);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}
inline float f_peak(F16 a) {
  const __m256 eight = _mm256_max_ps(a.lo, a.hi);
  const __m128 four = _mm_max_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_max_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_max_ss(two, _mm_shuffle_ps(two, two, 1)));
}

inline int32_t quantize16(F16 scaled, int8_t* out) {
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

inline I16 i_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline I16 i_add(I16 a, I16 b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline I16 i_sub(I16 a, int32_t b) {
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

// Σ_t w[4c+t]·x[t] per 32-bit lane: maddubs forms pair sums in int16, madd adds the pairs in int32.
// Exact while a pair sum fits int16: weights below 64 give at most 2·63·127.
inline __m256i dot4_half(__m256i w, __m256i x, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
}
inline I16 dot4(I16 acc, const Bytes& w, const int8_t* x) {
  const __m256i xv = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x)), ones = _mm256_set1_epi16(1);
  return {_mm256_add_epi32(acc.lo, dot4_half(w.lo, xv, ones)), _mm256_add_epi32(acc.hi, dot4_half(w.hi, xv, ones))};
}

// Two quads at once: each maddubs pair sum lies within ±2·63·127, so two of them still fit
// int16, and one madd serves both.
inline __m256i dot8_half(__m256i w1, __m256i x1, __m256i w2, __m256i x2) {
  const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w1, x1), _mm256_maddubs_epi16(w2, x2));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
inline I16 dot8(I16 acc, const Bytes& w1, const int8_t* x1, const Bytes& w2, const int8_t* x2) {
  const __m256i a = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x1));
  const __m256i b = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x2));
  return {_mm256_add_epi32(acc.lo, dot8_half(w1.lo, a, w2.lo, b)), _mm256_add_epi32(acc.hi, dot8_half(w1.hi, a, w2.hi, b))};
}

// Weights up to 255 would saturate maddubs' pair sums (2·255·127 > 32767): each byte is split
// into nibbles, whose pair sums fit, and the high nibbles' sums are weighted by 16 in madd.
inline __m256i dot4_wide_half(__m256i w, __m256i x) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i lo = _mm256_and_si256(w, low), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
  return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, x), _mm256_set1_epi16(1)),
                          _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x), _mm256_set1_epi16(16)));
}
inline I16 dot4_wide(I16 acc, const Bytes& w, const int8_t* x) {
  const __m256i xv = _mm256_set1_epi32(*reinterpret_cast<const int32_t*>(x));
  return {_mm256_add_epi32(acc.lo, dot4_wide_half(w.lo, xv)), _mm256_add_epi32(acc.hi, dot4_wide_half(w.hi, xv))};
}

}  // namespace isa
