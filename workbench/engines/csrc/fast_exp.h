// exp(x) in float, branch-free so that loops over it vectorize (the decode kernels' softmax and SiLU).
#pragma once

#include <cstdint>
#include <cstring>

namespace workbench_cpu {

// x = n ln2 + r with |r| <= ln2/2, e^r by its degree-7 Taylor polynomial (error below 2e-7
// relative), 2^n added to the exponent bits. Below -87 (where float's normal range ends) the
// result is 0, so exp(-inf) = 0; above 88 it is exp(88), ~1.65e38.
inline float fast_exp(float x) {
  const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = __builtin_rintf(xc * 1.44269504088896341f);
  const float r = (xc - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += static_cast<int32_t>(n) * (1 << 23);
  float y;
  std::memcpy(&y, &bits, sizeof y);
  return x < -87.0f ? 0.0f : y;
}

}  // namespace workbench_cpu
