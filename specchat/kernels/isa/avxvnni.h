// AVX-VNNI (Intel Core 12th to 15th gen, Core Ultra; AMD Zen 5): isa/avx2.h's operations, with
// the dot products of dpbusd on 256-bit registers, which multiplies unsigned weights by signed
// inputs straight into int32 (no 16-bit pairs, no nibble split for weights above 63).
//
// The instruction has two encodings with identical results: VEX (AVX-VNNI, `-mavxvnni`, what these
// laptops run) and EVEX (AVX512-VNNI with AVX512-VL, on CPUs with AVX-512). dpbusd() below is the
// one place that names it. The variant is built the first way; its EVEX twin
// (-DSPECCHAT_AVXVNNI_EVEX, compiled for AVX2 alone) writes the EVEX form in assembly, so that
// every other instruction and the 16 registers it works with are the laptop build's, and a
// machine with AVX-512 but without AVX-VNNI can check its bits and time it.
#pragma once

// isa/avx2.h's operations under this variant's name, without its dot unit (its re-include
// contract): this header defines ROWS_IN_REGISTERS, RowDot and Dot<R> below.
#if defined(SPECCHAT_AVXVNNI_EVEX)
#define SPECCHAT_AVX2_NAME "avxvnni-evex"
#else
#define SPECCHAT_AVX2_NAME "avxvnni"
#endif
#define SPECCHAT_AVX2_OWN_DOTS
#include "isa/avx2.h"

namespace isa {

inline __m256i dpbusd(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, w, x);
#elif defined(SPECCHAT_AVXVNNI_EVEX)
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x));  // acc += w (unsigned) · x (signed)
  return acc;
#else
#error "isa/avxvnni.h needs -mavxvnni (or, for its EVEX twin, -DSPECCHAT_AVXVNNI_EVEX)"
#endif
}

constexpr int ROWS_IN_REGISTERS = 8;  // one register a row, in each half of the block in turn

struct RowDot {
  static constexpr int ROWS = 1;
  static constexpr int PARTS = 2;  // channels 0-7, then 8-15
  struct Octet { __m256i a_lo, a_hi, b_lo, b_hi; };
  struct Dots { __m256i lo, hi; };
  struct Scale { __m256i lo, hi; };
  using Acc = I32x16;

  template <int MAXW>
  static Octet octet(const Bytes& a, const Bytes& b) { return {a.lo, a.hi, b.lo, b.hi}; }
  template <int MAXW>
  static constexpr int room() { return 1 << 20; }
  static constexpr bool PART_AT_A_TIME = true;  // in passes of 2 rows or more: see core/blocks.h
  template <int MAXW>
  static constexpr int room_one_part() { return room<MAXW>(); }
  static Dots zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  template <int MAXW, int PART>
  static Dots add(Dots d, const Octet& w, const int8_t* const* rows, int64_t at) {
    const int8_t* x = rows[0] + at;
    asm("" : "+r"(x));  // a broadcast per part (see isa/avx2.h)
    const __m256i xa = _mm256_set1_epi32(load32(x)), xb = _mm256_set1_epi32(load32(x + 4));
    if constexpr (PART == 0)
      d.lo = dpbusd(dpbusd(d.lo, w.a_lo, xa), w.b_lo, xb);
    else
      d.hi = dpbusd(dpbusd(d.hi, w.a_hi, xa), w.b_hi, xb);
    return d;
  }
  static Scale scale_u8(const uint8_t* p) { return {_mm256_cvtepu8_epi32(load8(p)), _mm256_cvtepu8_epi32(load8(p + 8))}; }
  static Scale scale_i8(const int8_t* p) { return {_mm256_cvtepi8_epi32(load8(p)), _mm256_cvtepi8_epi32(load8(p + 8))}; }
  static Acc acc_zero() { return i_zero(); }
  template <int MAXW, int PART>
  static Acc flush(Acc a, const Dots& d, const Scale& s) {
    if constexpr (PART == 0)
      a.lo = _mm256_add_epi32(a.lo, _mm256_mullo_epi32(d.lo, s.lo));
    else
      a.hi = _mm256_add_epi32(a.hi, _mm256_mullo_epi32(d.hi, s.hi));
    return a;
  }
  static I32x16 row(const Acc& a, int) { return a; }
};
template <int R>
using Dot = RowDot;

}  // namespace isa
