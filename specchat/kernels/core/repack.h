// A GGUF tensor's blocks laid out for the kernels (the packed layout of core/layout.h), in one pass
// over the blocks on every core. It writes the same bytes as specchat/kernels/formats.py's
// unpack_*() followed by pack(), which stays the reference (tests/kernels/test_repack.py compares
// them byte for byte) but is far slower: the rates, docs/lab/2026-12-05-big-targets.md.
//
// Torch-free like the rest of core/: threads come through the `parallel_for` its includer defines.
#pragma once
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "layout.h"

// Internal linkage, as layout.h's Kind: each kernel variant is its own module.
namespace {
namespace repack {

// The GGUF block types kept as they are (formats.py's KEPT_TYPES "gguf").
enum class Source { Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16, F32 };

struct Format {
  Source source;
  Kind kind;          // the kernels' kind (core/layout.h)
  int block_bytes;    // bytes of one GGUF block
  int block_weights;  // weights of one GGUF block (the super-block S of the packed kind)
  int offset;         // q6, q8: the value standing for zero
};

inline Format format_of(const std::string& type) {
  if (type == "Q4_K") return {Source::Q4_K, Kind::q4, 144, 256, 0};
  if (type == "Q5_K") return {Source::Q5_K, Kind::q5, 176, 256, 0};
  if (type == "Q6_K") return {Source::Q6_K, Kind::q6, 210, 256, 32};
  if (type == "Q8_0") return {Source::Q8_0, Kind::q8, 34, 32, 128};
  if (type == "Q4_0") return {Source::Q4_0, Kind::q4, 18, 32, 0};
  if (type == "Q4_1") return {Source::Q4_1, Kind::q4, 20, 32, 0};
  if (type == "Q5_0") return {Source::Q5_0, Kind::q6, 22, 32, 16};
  if (type == "Q5_1") return {Source::Q5_1, Kind::q5, 24, 32, 0};
  if (type == "F16") return {Source::F16, Kind::f16, 32, 16, 0};
  if (type == "BF16") return {Source::BF16, Kind::f32, 32, 16, 0};
  if (type == "F32") return {Source::F32, Kind::f32, 64, 16, 0};
  throw std::invalid_argument("no native repacking for GGUF type " + type);
}

inline bool is_float(const Format& f) { return is_float_kind(f.kind); }

// Where the packed arrays go (the caller sizes them: formats.packed_bytes's arrays); unused: null.
struct Out {
  uint8_t* q = nullptr;
  uint8_t* qh = nullptr;
  uint8_t* sc = nullptr;  // u8 (q4, q5) or the bits of i8 (q6, q8)
  uint8_t* mn = nullptr;
  uint16_t* d = nullptr;  // fp16 bits
  uint16_t* dm = nullptr;
};

// One super-block of one row, one value per weight (formats.Unpacked's view of it).
struct Decoded {
  uint8_t v[256];
  uint8_t sc[16];
  uint8_t mn[8];
  uint16_t d, dm;
};

inline uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

inline void nibbles32(const uint8_t* qs, uint8_t* v) {  // weights 0..15 low nibbles, 16..31 high
  for (int i = 0; i < 16; ++i) {
    v[i] = qs[i] & 0x0F;
    v[16 + i] = qs[i] >> 4;
  }
}

inline void k_scales(const uint8_t* s, Decoded& out) {  // Q4_K's and Q5_K's 12 bytes of 6-bit scales and mins
  for (int i = 0; i < 4; ++i) {
    out.sc[i] = s[i] & 0x3F;
    out.sc[4 + i] = static_cast<uint8_t>((s[8 + i] & 0x0F) | ((s[i] >> 2) & 0x30));
    out.mn[i] = s[4 + i] & 0x3F;
    out.mn[4 + i] = static_cast<uint8_t>((s[8 + i] >> 4) | ((s[4 + i] >> 2) & 0x30));
  }
}

inline void decode(const Format& f, const uint8_t* b, Decoded& out) {
  switch (f.source) {
    case Source::Q4_K:
    case Source::Q5_K: {
      const bool five = f.source == Source::Q5_K;
      out.d = u16(b);
      out.dm = u16(b + 2);
      k_scales(b + 4, out);
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int i = 0; i < 4; ++i)
        for (int l = 0; l < 32; ++l) {
          out.v[64 * i + l] = qs[32 * i + l] & 0x0F;
          out.v[64 * i + 32 + l] = qs[32 * i + l] >> 4;
        }
      if (five) {
        const uint8_t* qh = b + 16;
        for (int g = 0; g < 8; ++g)
          for (int l = 0; l < 32; ++l) out.v[32 * g + l] |= static_cast<uint8_t>(((qh[l] >> g) & 1) << 4);
      }
      return;
    }
    case Source::Q6_K: {
      const uint8_t *ql = b, *qh = b + 128;
      for (int h = 0; h < 2; ++h)
        for (int a = 0; a < 4; ++a)
          for (int l = 0; l < 32; ++l) {
            const int low = (ql[64 * h + (a & 1) * 32 + l] >> (4 * (a >> 1))) & 0x0F;
            const int high = (qh[32 * h + l] >> (2 * a)) & 0x03;
            out.v[128 * h + 32 * a + l] = static_cast<uint8_t>(low | (high << 4));
          }
      std::memcpy(out.sc, b + 192, 16);
      out.d = u16(b + 208);
      return;
    }
    case Source::Q8_0:
      out.d = u16(b);
      for (int i = 0; i < 32; ++i) out.v[i] = b[2 + i] ^ 0x80;  // int8 + 128
      out.sc[0] = out.sc[1] = 1;
      return;
    case Source::Q4_0:
      out.d = out.dm = u16(b);
      nibbles32(b + 2, out.v);
      out.sc[0] = 1;
      out.mn[0] = 8;  // w = d·(q − 8)
      return;
    case Source::Q4_1:
    case Source::Q5_1: {
      const bool five = f.source == Source::Q5_1;
      out.d = u16(b);
      out.dm = u16(b + 2) ^ 0x8000;  // w = d·q + m = d·q − (−m)·1
      nibbles32(b + (five ? 8 : 4), out.v);
      if (five) {
        const uint32_t qh = static_cast<uint32_t>(b[4]) | (b[5] << 8) | (b[6] << 16) | (static_cast<uint32_t>(b[7]) << 24);
        for (int j = 0; j < 32; ++j) out.v[j] |= static_cast<uint8_t>(((qh >> j) & 1) << 4);
      }
      out.sc[0] = out.mn[0] = 1;
      return;
    }
    case Source::Q5_0: {
      out.d = u16(b);
      const uint32_t qh = static_cast<uint32_t>(b[2]) | (b[3] << 8) | (b[4] << 16) | (static_cast<uint32_t>(b[5]) << 24);
      nibbles32(b + 6, out.v);
      for (int j = 0; j < 32; ++j) out.v[j] |= static_cast<uint8_t>(((qh >> j) & 1) << 4);
      out.sc[0] = out.sc[1] = 1;
      return;
    }
    default:
      return;
  }
}

// Super-block s of channel c of channel block b (0-based within this call's output).
inline void place(const Format& f, const Decoded& in, int64_t b, int c, int64_t s, int64_t k, const Out& out) {
  const int S = f.block_weights;
  const int64_t g32 = k / 32, g16 = k / 16, supers = k / S;
  out.d[(b * supers + s) * 16 + c] = in.d;
  if (has_mins(f.kind)) {
    out.dm[(b * supers + s) * 16 + c] = in.dm;
    const bool five = f.kind == Kind::q5;
    for (int gl = 0; gl < S / 32; ++gl) {
      const int64_t base = b * g32 + s * (S / 32) + gl;
      const uint8_t* v = in.v + 32 * gl;
      for (int j = 0; j < 4; ++j)
        for (int t = 0; t < 4; ++t)
          out.q[(base * 4 + j) * 64 + c * 4 + t] =
              static_cast<uint8_t>((v[4 * j + t] & 0x0F) | ((v[16 + 4 * j + t] & 0x0F) << 4));
      if (five)
        for (int t = 0; t < 4; ++t) {
          int bits = 0;
          for (int j = 0; j < 8; ++j) bits |= ((v[4 * j + t] >> 4) & 1) << j;
          out.qh[base * 64 + c * 4 + t] = static_cast<uint8_t>(bits);
        }
      out.sc[base * 16 + c] = in.sc[gl];
      out.mn[base * 16 + c] = in.mn[gl];
    }
    return;
  }
  for (int gl = 0; gl < S / 16; ++gl) out.sc[(b * g16 + s * (S / 16) + gl) * 16 + c] = in.sc[gl];
  if (f.kind == Kind::q8) {
    for (int gl = 0; gl < S / 16; ++gl) {
      const int64_t base = b * g16 + s * (S / 16) + gl;
      for (int j = 0; j < 4; ++j)
        for (int t = 0; t < 4; ++t) out.q[(base * 4 + j) * 64 + c * 4 + t] = in.v[16 * gl + 4 * j + t];
    }
    return;
  }
  for (int gl = 0; gl < S / 32; ++gl) {  // q6: a_j whole with b_j's top bits, b_j's low bits paired
    const int64_t base = b * g32 + s * (S / 32) + gl;
    const uint8_t* v = in.v + 32 * gl;
    for (int j = 0; j < 4; ++j)
      for (int t = 0; t < 4; ++t)
        out.q[(base * 4 + j) * 64 + c * 4 + t] = static_cast<uint8_t>((v[4 * j + t] & 0x3F) | ((v[16 + 4 * j + t] >> 4) << 6));
    for (int h = 0; h < 2; ++h)
      for (int t = 0; t < 4; ++t)
        out.qh[(base * 2 + h) * 64 + c * 4 + t] =
            static_cast<uint8_t>((v[16 + 8 * h + t] & 0x0F) | ((v[16 + 8 * h + 4 + t] & 0x0F) << 4));
  }
}

inline void float_row(const Format& f, const uint8_t* row, int64_t k, uint8_t* out) {
  if (f.source == Source::BF16) {
    uint32_t* wide = reinterpret_cast<uint32_t*>(out);
    for (int64_t i = 0; i < k; ++i) wide[i] = static_cast<uint32_t>(u16(row + 2 * i)) << 16;
    return;
  }
  std::memcpy(out, row, static_cast<size_t>(k) * (f.source == Source::F32 ? 4 : 2));
}

// Rows [0, n) of an [?, k] GGUF tensor whose bytes start at `raw` (row r at r * row_bytes), or, with
// `order`, output row i read from source row order[i] (a permutation or a range: the caller checks
// every index is a row of `raw`). Output channels are padded with zeros to a multiple of 16.
inline void repack(const Format& f, const uint8_t* raw, int64_t n, int64_t k, const int64_t* order, const Out& out) {
  if (k % f.block_weights || (is_float(f) && k % 16)) throw std::invalid_argument("a row is not whole blocks");
  const int64_t row_bytes = k / f.block_weights * f.block_bytes, blocks = (n + 15) / 16;
  const int64_t supers = k / f.block_weights;
  const int64_t out_row = is_float(f) ? k * (f.source == Source::F16 ? 2 : 4) : 0;
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    Decoded zero{};
    Decoded in{};
    for (int64_t b = b0; b < b1; ++b)
      for (int c = 0; c < 16; ++c) {
        const int64_t r = 16 * b + c;
        const uint8_t* row = r < n ? raw + (order ? order[r] : r) * row_bytes : nullptr;
        if (is_float(f)) {
          uint8_t* target = out.q + (16 * b + c) * out_row;
          if (row)
            float_row(f, row, k, target);
          else
            std::memset(target, 0, static_cast<size_t>(out_row));
          continue;
        }
        for (int64_t s = 0; s < supers; ++s) {
          if (row) decode(f, row + s * f.block_bytes, in);
          place(f, row ? in : zero, b, c, s, k, out);
        }
      }
  });
}

}  // namespace repack
}  // namespace
