// fp16 -> float for the packed scales. Every half is exactly a float, so this, F16C's vcvtph2ps
// and NEON's fcvtl give the same bits; written out here so the core needs no torch.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace isa {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa·2^-24, exact in float
    const float value = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -value : value;
  }
  const uint32_t bits = sign | (exponent == 0x1F ? 0x7F800000u : (exponent + 112) << 23) | (mantissa << 13);
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace isa
