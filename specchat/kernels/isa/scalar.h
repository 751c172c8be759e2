// The kernels' vector operations in plain C++: the reference the SIMD variants are checked against.
//
// F32x16 holds one float of each of a channel block's 16 channels, I32x16 one int32 of each, Bytes the
// 64 weight bytes of one quad of inputs (byte 4*c + t: input t of channel c). Every float
// operation is one IEEE operation per lane, rounded once (fmadd and fnmadd too), so a SIMD
// variant that does the same per lane gives the same bits; f_sum adds the lanes in one fixed order.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/half.h"

namespace isa {

constexpr const char* NAME = "scalar";
constexpr int ROWS_IN_REGISTERS = 8;
constexpr int FLOAT_ROW_TILE = 8;

struct F32x16 { float v[16]; };
struct I32x16 { int32_t v[16]; };
struct Bytes { uint8_t v[64]; };

template <typename Fn>
inline F32x16 f_each(Fn&& fn) {
  F32x16 out;
  for (int i = 0; i < 16; ++i) out.v[i] = fn(i);
  return out;
}

inline F32x16 f_zero() { return f_each([](int) { return 0.f; }); }
inline F32x16 f_set1(float x) { return f_each([x](int) { return x; }); }
inline F32x16 f_load(const float* p) { return f_each([p](int i) { return p[i]; }); }
inline void f_store(float* p, F32x16 a) { for (int i = 0; i < 16; ++i) p[i] = a.v[i]; }
inline F32x16 f_half(const uint16_t* p) { return f_each([p](int i) { return half_to_float(p[i]); }); }
inline F32x16 f_u8(const uint8_t* p) { return f_each([p](int i) { return static_cast<float>(p[i]); }); }
inline F32x16 f_i8(const int8_t* p) { return f_each([p](int i) { return static_cast<float>(p[i]); }); }
inline F32x16 f_from_i(I32x16 a) { return f_each([&a](int i) { return static_cast<float>(a.v[i]); }); }
inline F32x16 f_add(F32x16 a, F32x16 b) { return f_each([&](int i) { return a.v[i] + b.v[i]; }); }
inline F32x16 f_sub(F32x16 a, F32x16 b) { return f_each([&](int i) { return a.v[i] - b.v[i]; }); }
inline F32x16 f_mul(F32x16 a, F32x16 b) { return f_each([&](int i) { return a.v[i] * b.v[i]; }); }
inline F32x16 f_div(F32x16 a, F32x16 b) { return f_each([&](int i) { return a.v[i] / b.v[i]; }); }
// As the x86 instructions: the second operand where the first is not smaller (or larger).
inline F32x16 f_min(F32x16 a, F32x16 b) { return f_each([&](int i) { return a.v[i] < b.v[i] ? a.v[i] : b.v[i]; }); }
inline F32x16 f_max(F32x16 a, F32x16 b) { return f_each([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
inline F32x16 f_abs(F32x16 a) { return f_each([&](int i) { return std::fabs(a.v[i]); }); }
inline F32x16 f_fmadd(F32x16 a, F32x16 b, F32x16 c) { return f_each([&](int i) { return std::fma(a.v[i], b.v[i], c.v[i]); }); }
inline F32x16 f_fnmadd(F32x16 a, F32x16 b, F32x16 c) { return f_each([&](int i) { return std::fma(-a.v[i], b.v[i], c.v[i]); }); }
inline F32x16 f_round(F32x16 a) { return f_each([&](int i) { return std::nearbyint(a.v[i]); }); }  // ties to even

// p·2^n for whole n in [-126, 128] and p near 1: the first product is exact, the second rounds
// once, so this is the correctly rounded p·2^n (what AVX-512's scalef gives) even where it is subnormal.
inline F32x16 f_scale2(F32x16 p, F32x16 n) {
  return f_each([&](int i) {
    const int whole = static_cast<int>(n.v[i]), first = whole >> 1;
    return p.v[i] * std::ldexp(1.f, first) * std::ldexp(1.f, whole - first);
  });
}

// ((l0+l8)+(l4+l12)) + ((l2+l10)+(l6+l14)), then the odd lanes likewise, then the two: the order
// in which 512-bit, 256-bit and 128-bit halves are folded onto each other.
inline float f_sum(F32x16 a) {
  float eight[8], four[4];
  for (int i = 0; i < 8; ++i) eight[i] = a.v[i] + a.v[i + 8];
  for (int i = 0; i < 4; ++i) four[i] = eight[i] + eight[i + 4];
  return (four[0] + four[2]) + (four[1] + four[3]);
}
inline float f_peak(F32x16 a) {
  float peak = a.v[0];
  for (int i = 1; i < 16; ++i) peak = a.v[i] > peak ? a.v[i] : peak;
  return peak;
}

// As cvtps2dq: to nearest (ties to even); NaN and out-of-range values give INT32_MIN.
inline int32_t to_int32(float x) {
  const float r = std::nearbyint(x);
  return r >= -2147483648.f && r < 2147483648.f ? static_cast<int32_t>(r) : INT32_MIN;
}

// Each lane rounded to int32, stored saturated to int8; returns the sum of the int32 values.
inline int32_t quantize16(F32x16 scaled, int8_t* out) {
  uint32_t sum = 0;  // wraps as the vector sum does
  for (int i = 0; i < 16; ++i) {
    const int32_t v = to_int32(scaled.v[i]);
    out[i] = static_cast<int8_t>(v < -128 ? -128 : v > 127 ? 127 : v);
    sum += static_cast<uint32_t>(v);
  }
  return static_cast<int32_t>(sum);
}

inline I32x16 i_zero() { return I32x16{}; }
inline I32x16 i_add(I32x16 a, I32x16 b) {
  for (int i = 0; i < 16; ++i) a.v[i] += b.v[i];
  return a;
}
inline I32x16 i_sub(I32x16 a, int32_t b) {
  for (int i = 0; i < 16; ++i) a.v[i] -= b;
  return a;
}

inline Bytes b_load(const uint8_t* p) {
  Bytes out;
  for (int i = 0; i < 64; ++i) out.v[i] = p[i];
  return out;
}
inline Bytes b_or(Bytes a, Bytes b) {
  for (int i = 0; i < 64; ++i) a.v[i] |= b.v[i];
  return a;
}
// Each byte shifted right by SHIFT (left by -SHIFT where it is negative), then masked; the mask
// keeps only bits the byte's own bits moved into (within the low 8 - SHIFT, or from bit -SHIFT up).
template <int SHIFT>
inline Bytes b_bits(Bytes a, uint8_t mask) {
  for (int i = 0; i < 64; ++i) {
    const int moved = SHIFT >= 0 ? a.v[i] >> SHIFT : a.v[i] << -SHIFT;
    a.v[i] = static_cast<uint8_t>(moved & mask);
  }
  return a;
}

// ---------------------------------------------------------------- the integer phase
// (core/blocks.h: the exact sums A and B of each super-block.) Integer sums wrap modulo 2^32
// here as in every SIMD build; the sums of valid weights never come near that.
inline int32_t wrap(int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); }

// A row's sums, one row at a time (i8mm's Dot<R> takes two rows at once).
struct RowDot {
  static constexpr int ROWS = 1;
  static constexpr int PARTS = 1;  // register-sized parts of a channel block (see core/kernels.h)
  // The weights of an octet (two quads): a for inputs 0-3 of eight consecutive ones, b for 4-7.
  struct Octet { Bytes a, b; };
  // One row's products over some octets, per channel.
  struct Dots { int32_t v[16]; };
  // Each channel's multiplier for a group (its scale).
  struct Scale { int32_t v[16]; };
  using Acc = I32x16;

  template <int MAXW>  // the largest weight (15, 31, 63 or 255)
  static Octet octet(const Bytes& a, const Bytes& b) { return {a, b}; }
  // How many octets a Dots holds before flush (AVX2's are 16-bit).
  template <int MAXW>
  static constexpr int room() { return 1 << 20; }
  static Dots zero() { return Dots{}; }
  // d[c] += Σ_t a[4c + t]·x[t] + b[4c + t]·x[4 + t], x = rows[0] + at.
  template <int MAXW, int PART>
  static Dots add(Dots d, const Octet& w, const int8_t* const* rows, int64_t at) {
    const int8_t* x = rows[0] + at;
    for (int c = 0; c < 16; ++c)
      for (int t = 0; t < 4; ++t) d.v[c] = wrap(int64_t{d.v[c]} + w.a.v[4 * c + t] * x[t] + w.b.v[4 * c + t] * x[4 + t]);
    return d;
  }
  static Scale scale_u8(const uint8_t* p) {
    Scale s;
    for (int c = 0; c < 16; ++c) s.v[c] = p[c];
    return s;
  }
  static Scale scale_i8(const int8_t* p) {
    Scale s;
    for (int c = 0; c < 16; ++c) s.v[c] = p[c];
    return s;
  }
  static Acc acc_zero() { return I32x16{}; }
  // a[c] += s[c]·d[c].
  template <int MAXW, int PART>
  static Acc flush(Acc a, const Dots& d, const Scale& s) {
    for (int c = 0; c < 16; ++c) a.v[c] = wrap(a.v[c] + int64_t{s.v[c]} * d.v[c]);
    return a;
  }
  // Row k of the unit's sums.
  static I32x16 row(const Acc& a, int) { return a; }
};
template <int R>
using Dot = RowDot;

// Two groups' per-channel factors, paired for p_dot (the second all zero without a second group).
struct Pairs { int32_t a[16], b[16]; };
inline Pairs p_u8(const uint8_t* a, const uint8_t* b) {
  Pairs p;
  for (int c = 0; c < 16; ++c) p.a[c] = a[c], p.b[c] = b ? b[c] : 0;
  return p;
}
inline Pairs p_i8(const int8_t* a, const int8_t* b) {
  Pairs p;
  for (int c = 0; c < 16; ++c) p.a[c] = a[c], p.b[c] = b ? b[c] : 0;
  return p;
}
// acc[c] += a[c]·sums[0] + b[c]·sums[1].
inline I32x16 p_dot(I32x16 acc, const Pairs& p, const int16_t* sums) {
  for (int c = 0; c < 16; ++c) acc.v[c] = wrap(int64_t{acc.v[c]} + p.a[c] * sums[0] + p.b[c] * sums[1]);
  return acc;
}
// a − k·b per lane.
inline I32x16 i_sub_mul(I32x16 a, const I32x16& b, int32_t k) {
  for (int c = 0; c < 16; ++c) a.v[c] = wrap(a.v[c] - int64_t{k} * b.v[c]);
  return a;
}

}  // namespace isa
