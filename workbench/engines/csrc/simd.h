// One register of floats and its few operations, for the instruction set `-march=native` gives
// (the decode kernels' explicit AVX-512 / AVX2 / scalar paths; one float per "register" in the last).
#pragma once

#include <c10/util/BFloat16.h>

#include "fast_exp.h"

#include <immintrin.h>

namespace workbench_cpu {
namespace simd {

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kWidth = 16;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load(const c10::BFloat16* p) {  // 16 bf16 -> fp32: each one's bits are a float's upper half
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline void store(float* p, Vec a) { _mm512_storeu_ps(p, a); }
inline float sum(Vec a) { return _mm512_reduce_add_ps(a); }
inline __m256 halves_added(Vec a) { return _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline Vec vround(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec vscale2(Vec p, Vec n) {  // p * 2^n for whole n, by adding n to the exponent bits
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23)));
}
inline Vec zero_below(Vec y, Vec x, float least) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(least), _CMP_GE_OQ), y); }
inline float vmax_lanes(Vec a) { return _mm512_reduce_max_ps(a); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kWidth = 8;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load(const c10::BFloat16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline void store(float* p, Vec a) { _mm256_storeu_ps(p, a); }
inline float sum(Vec a) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
inline __m256 halves_added(Vec a) { return a; }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vmin(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline Vec vround(Vec a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec vscale2(Vec p, Vec n) {
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23)));
}
inline Vec zero_below(Vec y, Vec x, float least) { return _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(least), _CMP_GE_OQ)); }
inline float vmax_lanes(Vec a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
#else
using Vec = float;
constexpr int kWidth = 1;
inline Vec load(const float* p) { return *p; }
inline Vec load(const c10::BFloat16* p) { return static_cast<float>(*p); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return a * b + c; }
inline Vec add(Vec a, Vec b) { return a + b; }
inline Vec mul(Vec a, Vec b) { return a * b; }
inline Vec sub(Vec a, Vec b) { return a - b; }
inline Vec div(Vec a, Vec b) { return a / b; }
inline Vec zero() { return 0.0f; }
inline Vec splat(float x) { return x; }
inline void store(float* p, Vec a) { *p = a; }
inline float sum(Vec a) { return a; }
inline float vmax_lanes(Vec a) { return a; }
inline Vec vmax(Vec a, Vec b) { return a > b ? a : b; }
inline Vec vmin(Vec a, Vec b) { return a < b ? a : b; }
#endif

// exp of each lane: fast_exp.h's method (x = n ln2 + r, e^r by its degree-7 Taylor polynomial,
// 2^n added to the exponent bits; 0 below -87, exp(88) above 88), a register at a time.
inline Vec vexp(Vec x) {
#if defined(__AVX2__)
  const Vec xc = vmin(vmax(x, splat(-87.0f)), splat(88.0f));
  const Vec n = vround(mul(xc, splat(1.44269504088896341f)));
  const Vec r = fmadd(n, splat(-1.42860682030941723212e-6f), fmadd(n, splat(-0.693145751953125f), xc));
  Vec p = splat(1.0f / 5040);
  p = fmadd(p, r, splat(1.0f / 720));
  p = fmadd(p, r, splat(1.0f / 120));
  p = fmadd(p, r, splat(1.0f / 24));
  p = fmadd(p, r, splat(1.0f / 6));
  p = fmadd(p, r, splat(0.5f));
  p = fmadd(p, r, splat(1.0f));
  p = fmadd(p, r, splat(1.0f));
  return zero_below(vscale2(p, n), x, -87.0f);
#else
  return workbench_cpu::fast_exp(x);
#endif
}

// out[u] = sum(a[u]) for 8 registers at once: with AVX, three rounds of pairwise adds across
// registers (hadd) instead of eight reductions of one register each.
inline void sums8(const Vec* a, float* out) {
#if defined(__AVX2__)
  __m256 h[8];
  for (int u = 0; u < 8; ++u) h[u] = halves_added(a[u]);
  const __m256 s01 = _mm256_hadd_ps(h[0], h[1]), s23 = _mm256_hadd_ps(h[2], h[3]);
  const __m256 s45 = _mm256_hadd_ps(h[4], h[5]), s67 = _mm256_hadd_ps(h[6], h[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);  // per 128-bit lane
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20),
                                      _mm256_permute2f128_ps(s0123, s4567, 0x31)));
#else
  for (int u = 0; u < 8; ++u) out[u] = sum(a[u]);
#endif
}

}  // namespace simd
}  // namespace workbench_cpu
