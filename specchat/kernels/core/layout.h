// The packed layout: the kinds of weight matrix the kernels compute with, and the arrays each
// kind is packed into. specchat/kernels/formats.py (`pack`) writes these arrays, qgemm.cpp checks
// their sizes and hands them to the core as a Matrix (core/matrix.h), whose kernels read them.
//
// Channels come in blocks of 16 (one float or int32 lane per channel); N rows are padded to whole
// blocks, K inputs are whole super-blocks of S inputs (S a multiple of the group).
//   q4: q   [N/16][K/32][4][64] u8   group of 32 inputs: byte 64*j + 4*c + t holds input 4*j + t of
//                                     channel c in its low nibble and input 4*(j+4) + t in its high one
//       sc  [N/16][K/32][16] u8      6-bit scale of each group    w = d*sc*q - dmin*mn
//       mn  [N/16][K/32][16] u8      6-bit min of each group
//       d   [N/16][K/S][16]  fp16    super-block scales (S inputs)
//       dm  [N/16][K/S][16]  fp16
//   q5: q4's arrays (llama.cpp's Q5_K, Q5_1: values 0..31) and each value's fifth bit:
//       qh  [N/16][K/32][64] u8      byte 4*c + t: bit j is the fifth bit of input 4*j + t of channel c
//   q8: q   [N/16][K/16][4][64] u8   group of 16 inputs, byte 64*j + 4*c + t = input 4*j + t
//       sc  [N/16][K/16][16] i8      w = d*sc*(q - offset)
//       d   [N/16][K/S][16]  fp16
//   q6: q8's values 0..63 (llama.cpp's Q6_K) in 6 bits, sc and d as q8's; per group of 32 inputs,
//       with a_j = inputs 4*j + t and b_j = inputs 16 + 4*j + t of channel c:
//       q   [N/16][K/32][4][64] u8   byte 64*j + 4*c + t: a_j in bits 0-5, b_j's top two in bits 6-7
//       qh  [N/16][K/32][2][64] u8   byte 64*h + 4*c + t: b_2h's low four bits, b_2h+1's above them
//   f16, f32: q [N/16][16][K] fp16 / fp32, the weights themselves (llama.cpp's F16; F32 and BF16,
//       which widens to F32 exactly); these read the float input, not its int8 quantization
#pragma once
#include <cstdint>

namespace {

// A matrix's kind, numbered by the bits a weight takes in the kernel. The Python side passes the
// number: specchat/kernels/formats.py's KIND_CODES mirrors this list, and
// tests/kernels/test_formats.py holds the two equal (and the library's KINDS, made from KIND_NAMES).
enum class Kind : int { q4 = 4, q5 = 5, q6 = 6, q8 = 8, f16 = 16, f32 = 32 };

struct KindName {
  Kind kind;
  const char* name;
};
constexpr KindName KIND_NAMES[] = {{Kind::q4, "q4"},   {Kind::q5, "q5"},   {Kind::q6, "q6"},
                                   {Kind::q8, "q8"},   {Kind::f16, "f16"}, {Kind::f32, "f32"}};

// Whether `code` is one of the kinds (a number from Python, before it becomes a Kind).
inline bool is_kind(int64_t code) {
  for (const KindName& k : KIND_NAMES)
    if (static_cast<int64_t>(k.kind) == code) return true;
  return false;
}

inline int code_of(Kind kind) { return static_cast<int>(kind); }

// Float weights: no scales, and they read the float input.
inline bool is_float_kind(Kind kind) { return kind == Kind::f16 || kind == Kind::f32; }

// q4 and q5: unsigned 6-bit scales and a min per group of 32 (the other quantized kinds: signed
// 8-bit scales per group of 16 and an offset).
inline bool has_mins(Kind kind) { return kind == Kind::q4 || kind == Kind::q5; }

// Inputs per group of the q array: 16 for q8, 32 for the others.
inline int q_group(Kind kind) { return kind == Kind::q8 ? 16 : 32; }

// Inputs per scale of the sc array: 32 with mins, else 16.
inline int scale_group(Kind kind) { return has_mins(kind) ? 32 : 16; }

// Bytes of qh per channel block and group of 32 inputs: q5's fifth bits, q6's low nibbles; 0 if none.
inline int64_t qh_bytes_per_group(Kind kind) {
  return kind == Kind::q5 ? 64 : kind == Kind::q6 ? 128 : 0;
}

}  // namespace
