// The small ops of a decode step fused into one pass each, on a CPU (workbench/engines/cpu_kernels.py
// builds this file with decode_attention.cpp on the machine that runs it). Each runs on the calling
// thread: a decode step's rows are few, and under passive OpenMP waits an op on two threads first
// wakes the other one (tens of microseconds, more than the op).
//
// The math is the eager ops' that they replace (decode_step.py), rounding where those round:
// - rms_norm: x in fp32, times 1/sqrt(mean(x^2) + eps), rounded to x's dtype, times the weight
//   (the product rounded once more), as LlamaRMSNorm;
// - silu_mul: silu(gate) rounded to the dtype, times up (rounded), as `F.silu(gate) * up`.
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "fast_exp.h"
#include "simd.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

using namespace workbench_cpu::simd;

template <typename S>
inline S round_to(float x) {
  return static_cast<S>(x);
}

template <typename S>
void rms_rows(const S* x, const S* w, S* out, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const S* xr = x + r * n;
    S* yr = out + r * n;
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      for (int l = 0; l < 16; ++l) {
        const float v = static_cast<float>(xr[i + l]);
        lanes[l] += v * v;
      }
    for (int l = 0; l < 8; ++l) lanes[l] += lanes[l + 8];
    for (int l = 0; l < 4; ++l) lanes[l] += lanes[l + 4];
    float ss = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
    for (; i < n; ++i) {
      const float v = static_cast<float>(xr[i]);
      ss += v * v;
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t j = 0; j < n; ++j) {
      const float normed = static_cast<float>(round_to<S>(static_cast<float>(xr[j]) * inv));
      yr[j] = round_to<S>(static_cast<float>(w[j]) * normed);
    }
  }
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "rms_norm: CPU tensors");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rms_norm: x and weight in one dtype");
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0), "rms_norm: weight (", x.size(-1), ",), not ",
              weight.sizes());
  const at::Tensor xc = x.contiguous(), wc = weight.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t n = x.size(-1), rows = n ? xc.numel() / n : 0;
  if (x.scalar_type() == at::kBFloat16) {
    rms_rows(xc.data_ptr<c10::BFloat16>(), wc.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows, n,
             static_cast<float>(eps));
  } else if (x.scalar_type() == at::kFloat) {
    rms_rows(xc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(), rows, n, static_cast<float>(eps));
  } else {
    TORCH_CHECK(false, "rms_norm: bf16 or fp32, not ", x.scalar_type());
  }
  return out;
}

template <typename S>
void silu_mul_rows(const S* g, const S* u, S* out, int64_t rows, int64_t n, int64_t g_stride, int64_t u_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const S* gr = g + r * g_stride;
    const S* ur = u + r * u_stride;
    S* yr = out + r * n;
    int64_t j = 0;
    for (; j + kWidth <= n; j += kWidth) {  // silu a register at a time, the roundings one by one
      const Vec x = load(gr + j);
      float silu[kWidth];
      store(silu, div(x, add(splat(1.0f), vexp(sub(zero(), x)))));
      for (int l = 0; l < kWidth; ++l)
        yr[j + l] = round_to<S>(static_cast<float>(round_to<S>(silu[l])) * static_cast<float>(ur[j + l]));
    }
    for (; j < n; ++j) {
      const float x = static_cast<float>(gr[j]);
      const float silu = static_cast<float>(round_to<S>(x / (1.0f + workbench_cpu::fast_exp(-x))));
      yr[j] = round_to<S>(silu * static_cast<float>(ur[j]));
    }
  }
}

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.device().is_cpu() && up.device().is_cpu(), "silu_mul: CPU tensors");
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes(), "silu_mul: gate and up (B, N) of one shape, not ",
              gate.sizes(), " and ", up.sizes());
  TORCH_CHECK(gate.scalar_type() == up.scalar_type(), "silu_mul: gate and up in one dtype");
  TORCH_CHECK(gate.stride(1) == 1 && up.stride(1) == 1, "silu_mul: rows with a unit stride");
  const int64_t rows = gate.size(0), n = gate.size(1);
  at::Tensor out = at::empty({rows, n}, gate.options());
  if (gate.scalar_type() == at::kBFloat16) {
    silu_mul_rows(gate.data_ptr<c10::BFloat16>(), up.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows,
                  n, gate.stride(0), up.stride(0));
  } else if (gate.scalar_type() == at::kFloat) {
    silu_mul_rows(gate.data_ptr<float>(), up.data_ptr<float>(), out.data_ptr<float>(), rows, n, gate.stride(0),
                  up.stride(0));
  } else {
    TORCH_CHECK(false, "silu_mul: bf16 or fp32, not ", gate.scalar_type());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(workbench_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", rms_norm);
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor", silu_mul);
}
