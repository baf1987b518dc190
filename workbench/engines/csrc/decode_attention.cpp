// Attention of a decode step's new query tokens over a KV cache, on a CPU
// (workbench/engines/cpu_kernels.py builds this file on the machine that runs it).
//
// q (B, KV, G, D): each KV head's G query heads as G queries; keys and values (B, KV, T, D), any
// strides but a unit one on D (a view into the cache's buffer); bias (B, 1, 1, T) additive (0 at
// real positions, -inf elsewhere), all four in one dtype (bf16 or fp32). Returns (B, KV, G, D) in
// that dtype: softmax(q k^T * scale + bias) v, computed in fp32 and rounded once at the end.
//
// `helper`: the first half of the (row, KV head) tasks on the calling thread and the rest on the
// spinning helper thread (decode_helper.cpp; the split decode mode), instead of torch's threads.
//
// One (row, KV head) pair per task of at::parallel_for: its T keys are read once for its G
// queries, its T values once, so the work is one pass over the cache (what bounds a decode
// step's attention), with no copies, no expanded mask and no per-call setup.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "fast_exp.h"
#include "helper.h"
#include "simd.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using namespace workbench_cpu::simd;

// kD: the head dim (a multiple of kWidth, its loops unrolled when compiling); kD = 0: read from q,
// any size, one float at a time. q and the output may have any strides; keys and values a unit one on D.
template <typename S, int kD>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double scale,
            at::Tensor& out, bool helper) {
  const int64_t B = q.size(0), KV = q.size(1), G = q.size(2), T = k.size(2);
  const int64_t D = kD > 0 ? kD : q.size(3);
  const S* qp = q.data_ptr<S>();
  const S* kp = k.data_ptr<S>();
  const S* vp = v.data_ptr<S>();
  const S* bp = bias.data_ptr<S>();
  S* op = out.data_ptr<S>();
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides(), bs = bias.strides(), os = out.strides();
  const float sc = static_cast<float>(scale);
  const auto tasks = [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), scores(G * T), acc(G * D);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / KV, h = i % KV;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d)
          qf[g * D + d] = static_cast<float>(qp[b * qs[0] + h * qs[1] + g * qs[2] + d * qs[3]]) * sc;
      const S* kb = kp + b * ks[0] + h * ks[1];
      const S* vb = vp + b * vs[0] + h * vs[1];
      const S* bb = bp + b * bs[0];
      int64_t t0 = 0;
      if constexpr (kD > 0) {
        for (; t0 + 8 <= T; t0 += 8) {  // scores of 8 keys at once per query: 8 independent sums
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = qf.data() + g * D;
            Vec a[8];
            for (int u = 0; u < 8; ++u) a[u] = zero();
            for (int j = 0; j < kD / kWidth; ++j) {
              const Vec qv = load(qg + j * kWidth);
              for (int u = 0; u < 8; ++u) a[u] = fmadd(qv, load(kb + (t0 + u) * ks[2] + j * kWidth), a[u]);
            }
            float s8[8];
            sums8(a, s8);
            for (int u = 0; u < 8; ++u) scores[g * T + t0 + u] = s8[u] + static_cast<float>(bb[(t0 + u) * bs[3]]);
          }
        }
      }
      for (int64_t t = t0; t < T; ++t) {  // scores: each key against the G queries
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
        const float inf = std::numeric_limits<float>::infinity();
        float top = -inf;
        int64_t t = 0;
        if (T >= kWidth) {
          Vec m = splat(-inf);
          for (; t + kWidth <= T; t += kWidth) m = vmax(m, load(sg + t));
          top = vmax_lanes(m);
        }
        for (; t < T; ++t) top = sg[t] > top ? sg[t] : top;
        if (top == -inf) {  // no real position: zeros, not NaN
          std::fill(sg, sg + T, 0.0f);
          continue;
        }
        const Vec vtop = splat(top);
        Vec totals = zero();
        for (t = 0; t + kWidth <= T; t += kWidth) {
          const Vec e = vexp(sub(load(sg + t), vtop));
          store(sg + t, e);
          totals = add(totals, e);
        }
        float total = sum(totals);
        for (; t < T; ++t) {
          sg[t] = workbench_cpu::fast_exp(sg[t] - top);
          total += sg[t];
        }
        const float inv = 1.0f / total;
        for (t = 0; t < T; ++t) sg[t] *= inv;
      }
      if constexpr (kD > 0) {
        // the values, weighted: per query, a chunk of up to 8 registers of its output summed over all
        // T in registers (two sets, even and odd t, where a chunk is 4 or fewer: independent sums)
        constexpr int kRegs = kD / kWidth, kChunk = kRegs < 8 ? kRegs : 8, kSets = kChunk <= 4 ? 2 : 1;
        for (int64_t g = 0; g < G; ++g) {
          const float* pg = scores.data() + g * T;
          for (int j0 = 0; j0 < kRegs; j0 += kChunk) {
            Vec a[kSets][kChunk];
            for (int s = 0; s < kSets; ++s)
              for (int j = 0; j < kChunk; ++j) a[s][j] = zero();
            int64_t t = 0;
            for (; t + kSets <= T; t += kSets)
              for (int s = 0; s < kSets; ++s) {
                const Vec p = splat(pg[t + s]);
                const S* vt = vb + (t + s) * vs[2] + j0 * kWidth;
                for (int j = 0; j < kChunk; ++j) a[s][j] = fmadd(p, load(vt + j * kWidth), a[s][j]);
              }
            for (; t < T; ++t) {
              const Vec p = splat(pg[t]);
              const S* vt = vb + t * vs[2] + j0 * kWidth;
              for (int j = 0; j < kChunk; ++j) a[0][j] = fmadd(p, load(vt + j * kWidth), a[0][j]);
            }
            for (int j = 0; j < kChunk; ++j) {
              Vec total = a[0][j];
              for (int s = 1; s < kSets; ++s) total = add(total, a[s][j]);
              store(acc.data() + g * D + (j0 + j) * kWidth, total);
            }
          }
        }
      } else {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t t = 0; t < T; ++t) {  // the values, weighted
          const S* vt = vb + t * vs[2];
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
  };
  const int64_t n = B * KV;
  if (helper) {
    workbench_cpu::run_both([&] { tasks(0, n / 2); }, [&] { tasks(n / 2, n); });
  } else {
    at::parallel_for(0, n, 1, tasks);
  }
}

template <typename S>
void attend_any(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double scale,
                at::Tensor& out, bool helper) {
  switch (q.size(3)) {  // the common head dims with their loops unrolled
    case 32: return attend<S, 32>(q, k, v, bias, scale, out, helper);
    case 64: return attend<S, 64>(q, k, v, bias, scale, out, helper);
    case 128: return attend<S, 128>(q, k, v, bias, scale, out, helper);
    default: return attend<S, 0>(q, k, v, bias, scale, out, helper);
  }
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& bias, double scale, bool helper) {
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
    attend_any<c10::BFloat16>(q, keys, values, bias, scale, out, helper);
  } else if (dtype == at::kFloat) {
    attend_any<float>(q, keys, values, bias, scale, out, helper);
  } else {
    TORCH_CHECK(false, "decode_attention: bf16 or fp32, not ", dtype);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(workbench_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor keys, Tensor values, Tensor bias, float scale, bool helper=False) -> Tensor",
        decode_attention);
}
