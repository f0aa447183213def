// Element types the numeric kernels read and write: float32, or bfloat16
// (its bits), converted as XLA converts. Shared by the sparse optimizer
// step and the neighbour sum, on both backends.
#ifndef JDIRECT_FFI_ELEMENTS_H_
#define JDIRECT_FFI_ELEMENTS_H_

#include <cstdint>
#include <cstring>

#include "index.h"  // JDIRECT_HD

namespace jdirect {

// bfloat16 rounds to nearest even; NaNs stay NaNs.
struct Bf16 {
  uint16_t bits;
};

JDIRECT_HD float ToFloat(float x) { return x; }
JDIRECT_HD float ToFloat(Bf16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

template <typename T>
JDIRECT_HD T FromFloat(float x);
template <>
JDIRECT_HD float FromFloat<float>(float x) {
  return x;
}
template <>
JDIRECT_HD Bf16 FromFloat<Bf16>(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{static_cast<uint16_t>(u >> 16)};
}

}  // namespace jdirect

#endif  // JDIRECT_FFI_ELEMENTS_H_
