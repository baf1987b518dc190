// Attention of a decode step's new query tokens over a KV cache, on a CPU
// (workbench/engines/cpu_kernels.py builds this file on the machine that runs it).
//
// q (B, KV, G, D): each KV head's G query heads as G queries; keys and values (B, KV, T, D), any
// strides but a unit one on D (a view into the cache's buffer); bias (B, 1, 1, T) additive (0 at
// real positions, -inf elsewhere), all four in one dtype (bf16 or fp32). Returns (B, KV, G, D) in
// that dtype: softmax(q k^T * scale + bias) v, computed in fp32 and rounded once at the end.
//
// One (row, KV head) pair per task of at::parallel_for: its T keys are read once for its G
// queries, its T values once, so the work is one pass over the cache (what bounds a decode
// step's attention), with no copies, no expanded mask and no per-call setup.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "fast_exp.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// One register of floats and its few operations, for the instruction set `-march=native` gives.
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kWidth = 16;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load(const c10::BFloat16* p) {  // 16 bf16 -> fp32: each one's bits are a float's upper half
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec splat(float x) { return _mm512_set1_ps(x); }
inline void store(float* p, Vec a) { _mm512_storeu_ps(p, a); }
inline float sum(Vec a) { return _mm512_reduce_add_ps(a); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kWidth = 8;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load(const c10::BFloat16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec splat(float x) { return _mm256_set1_ps(x); }
inline void store(float* p, Vec a) { _mm256_storeu_ps(p, a); }
inline float sum(Vec a) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
#else
using Vec = float;
constexpr int kWidth = 1;
inline Vec load(const float* p) { return *p; }
inline Vec load(const c10::BFloat16* p) { return static_cast<float>(*p); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return a * b + c; }
inline Vec zero() { return 0.0f; }
inline Vec splat(float x) { return x; }
inline void store(float* p, Vec a) { *p = a; }
inline float sum(Vec a) { return a; }
#endif

// kD: the head dim (a multiple of kWidth, its loops unrolled when compiling); kD = 0: read from q,
// any size, one float at a time. q and the output may have any strides; keys and values a unit one on D.
template <typename S, int kD>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double scale,
            at::Tensor& out) {
  const int64_t B = q.size(0), KV = q.size(1), G = q.size(2), T = k.size(2);
  const int64_t D = kD > 0 ? kD : q.size(3);
  const S* qp = q.data_ptr<S>();
  const S* kp = k.data_ptr<S>();
  const S* vp = v.data_ptr<S>();
  const S* bp = bias.data_ptr<S>();
  S* op = out.data_ptr<S>();
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides(), bs = bias.strides(), os = out.strides();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * KV, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), scores(G * T), acc(G * D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / KV, h = i % KV;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d)
          qf[g * D + d] = static_cast<float>(qp[b * qs[0] + h * qs[1] + g * qs[2] + d * qs[3]]) * sc;
      const S* kb = kp + b * ks[0] + h * ks[1];
      const S* vb = vp + b * vs[0] + h * vs[1];
      const S* bb = bp + b * bs[0];
      for (int64_t t = 0; t < T; ++t) {  // scores: each key against the G queries
        const S* kt = kb + t * ks[2];
        const float add = static_cast<float>(bb[t * bs[3]]);
        if constexpr (kD > 0) {
          Vec key[kD / kWidth];  // the key, converted once for the G queries
          for (int j = 0; j < kD / kWidth; ++j) key[j] = load(kt + j * kWidth);
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = qf.data() + g * D;
            Vec a = zero();
            for (int j = 0; j < kD / kWidth; ++j) a = fmadd(load(qg + j * kWidth), key[j], a);
            scores[g * T + t] = sum(a) + add;
          }
        } else {
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = qf.data() + g * D;
            float s = 0;
            for (int64_t d = 0; d < D; ++d) s += qg[d] * static_cast<float>(kt[d]);
            scores[g * T + t] = s + add;
          }
        }
      }
      for (int64_t g = 0; g < G; ++g) {  // softmax over the T positions
        float* sg = scores.data() + g * T;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < T; ++t) top = sg[t] > top ? sg[t] : top;
        if (top == -std::numeric_limits<float>::infinity()) {  // no real position: zeros, not NaN
          std::fill(sg, sg + T, 0.0f);
          continue;
        }
        for (int64_t t = 0; t < T; ++t) sg[t] = workbench_cpu::fast_exp(sg[t] - top);
        float total = 0;
        for (int64_t t = 0; t < T; ++t) total += sg[t];
        const float inv = 1.0f / total;
        for (int64_t t = 0; t < T; ++t) sg[t] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t t = 0; t < T; ++t) {  // the values, weighted
        const S* vt = vb + t * vs[2];
        if constexpr (kD > 0) {
          Vec value[kD / kWidth];  // the value, converted once for the G queries
          for (int j = 0; j < kD / kWidth; ++j) value[j] = load(vt + j * kWidth);
          for (int64_t g = 0; g < G; ++g) {
            const Vec p = splat(scores[g * T + t]);
            float* a = acc.data() + g * D;
            for (int j = 0; j < kD / kWidth; ++j) store(a + j * kWidth, fmadd(p, value[j], load(a + j * kWidth)));
          }
        } else {
          for (int64_t g = 0; g < G; ++g) {
            const float p = scores[g * T + t];
            float* a = acc.data() + g * D;
            for (int64_t d = 0; d < D; ++d) a[d] += p * static_cast<float>(vt[d]);
          }
        }
      }
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d)
          op[b * os[0] + h * os[1] + g * os[2] + d * os[3]] = static_cast<S>(acc[g * D + d]);
    }
  });
}

template <typename S>
void attend_any(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double scale,
                at::Tensor& out) {
  switch (q.size(3)) {  // the common head dims with their loops unrolled
    case 32: return attend<S, 32>(q, k, v, bias, scale, out);
    case 64: return attend<S, 64>(q, k, v, bias, scale, out);
    case 128: return attend<S, 128>(q, k, v, bias, scale, out);
    default: return attend<S, 0>(q, k, v, bias, scale, out);
  }
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& bias, double scale) {
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.dim() == 4 && bias.dim() == 4,
              "decode_attention: q (B, KV, G, D), keys and values (B, KV, T, D), bias (B, 1, 1, T)");
  TORCH_CHECK(keys.sizes() == values.sizes() && q.size(0) == keys.size(0) && q.size(1) == keys.size(1) &&
                  q.size(3) == keys.size(3) && bias.size(0) == q.size(0) && bias.size(3) == keys.size(2),
              "decode_attention: shapes do not match: q ", q.sizes(), ", keys ", keys.sizes(), ", values ",
              values.sizes(), ", bias ", bias.sizes());
  TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1, "decode_attention: keys and values need a unit stride on D");
  TORCH_CHECK(q.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu() && bias.device().is_cpu(),
              "decode_attention: CPU tensors");
  const auto dtype = keys.scalar_type();
  TORCH_CHECK(q.scalar_type() == dtype && values.scalar_type() == dtype && bias.scalar_type() == dtype,
              "decode_attention: q, keys, values and bias in one dtype");
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (dtype == at::kBFloat16) {
    attend_any<c10::BFloat16>(q, keys, values, bias, scale, out);
  } else if (dtype == at::kFloat) {
    attend_any<float>(q, keys, values, bias, scale, out);
  } else {
    TORCH_CHECK(false, "decode_attention: bf16 or fp32, not ", dtype);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(workbench_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor keys, Tensor values, Tensor bias, float scale) -> Tensor", decode_attention);
}
