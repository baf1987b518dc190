// Products of a few rows by a whole weight, on a CPU: a decode step's linears (workbench/engines/
// cpu_kernels.py builds this file with the other kernels; skinny_weights.py packs the weights).
//
// A decode step at a few rows multiplies each weight by B rows: 2 B flops per weight element
// read, so the product is bound by the weight's read, and a kernel built for square matrices
// (MKL's sgemm, oneDNN's brgemm) spends most of it on setup and blocking made for reuse the rows do
// not have. Here the weight (N, K) is laid out once in panels of 16 outputs, (ceil(N / 16), K, 16):
// a panel is one contiguous stream, read once per block of rows (kMaxRows: as many rows as the
// registers hold accumulators for), each of its K steps one or two loads and one broadcast of
// x[r, k] per row, and every sum is over k in order, in fp32, rounded once (with the bias added
// in fp32) to the output's dtype.
//
// x (M, K) fp32 or bf16 (bf16 rows are widened to fp32 first), packed (P, K, 16) fp32 or bf16,
// bias (N,) or none, out (M, N) in x's dtype. `skinny_linear` runs its panels on torch's threads
// (at::parallel_for), `skinny_halves` half of them on the calling thread and half on the spinning
// helper's (decode_helper.cpp; the split decode mode).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "simd.h"
#include "helper.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

using namespace workbench_cpu::simd;

constexpr int kPanel = 16;             // outputs per panel
constexpr int kVecs = kPanel / kWidth;  // registers per panel row
// Rows per block: kVecs * kMaxRows accumulators, plus kVecs weight registers and a broadcast,
// within the 16 (AVX2) or 32 (AVX-512) registers.
#if defined(__AVX512F__)
constexpr int kMaxRows = 16;
#elif defined(__AVX2__)
constexpr int kMaxRows = 6;
#else
constexpr int kMaxRows = 4;
#endif

#ifndef WB_PREFETCH
#define WB_PREFETCH 32
#endif
// Panel rows ahead of the one multiplied that are asked for from memory (0: none, the hardware's
// prefetcher alone).
constexpr int64_t kPrefetch = WB_PREFETCH;

inline float widen(float v) { return v; }
inline float widen(c10::BFloat16 v) { return static_cast<float>(v); }

// rows x 16 outputs of one panel over all K: acc (rows, 16) fp32.
template <int R, typename W>
inline void block(const float* x, int64_t K, const W* panel, float* acc) {
  Vec sums[R][kVecs];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) sums[r][v] = zero();
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; ++k) {
    if constexpr (kPrefetch > 0) _mm_prefetch(reinterpret_cast<const char*>(panel + (k + kPrefetch) * kPanel), _MM_HINT_T0);
    Vec w[kVecs];
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) w[v] = load(panel + k * kPanel + v * kWidth);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Vec xr = splat(x[r * K + k]);
#pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) sums[r][v] = fmadd(xr, w[v], sums[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < kVecs; ++v) store(acc + r * kPanel + v * kWidth, sums[r][v]);
}

template <typename W>
void block_rows(int rows, const float* x, int64_t K, const W* panel, float* acc) {
  switch (rows) {
#define WB_CASE(n) \
  case n:          \
    if constexpr (n <= kMaxRows) return block<n>(x, K, panel, acc);
    WB_CASE(1) WB_CASE(2) WB_CASE(3) WB_CASE(4) WB_CASE(5) WB_CASE(6) WB_CASE(7) WB_CASE(8)
    WB_CASE(9) WB_CASE(10) WB_CASE(11) WB_CASE(12) WB_CASE(13) WB_CASE(14) WB_CASE(15) WB_CASE(16)
#undef WB_CASE
    default:
      TORCH_CHECK(false, "skinny_linear: a block of ", rows, " rows (at most ", kMaxRows, ")");
  }
}

// Panels [p0, p1) of out = x @ W.T + bias: x (M, K) fp32, out (M, N) of dtype O.
template <typename W, typename O>
void panels(const float* x, int64_t M, int64_t K, const W* packed, const float* bias, O* out, int64_t N, int64_t p0,
            int64_t p1) {
  float acc[kMaxRows * kPanel];
  for (int64_t p = p0; p < p1; ++p) {
    const W* panel = packed + p * K * kPanel;
    const int64_t n0 = p * kPanel, width = std::min<int64_t>(kPanel, N - n0);
    for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, M - m0));
      block_rows(rows, x + m0 * K, K, panel, acc);
      for (int r = 0; r < rows; ++r) {
        O* o = out + (m0 + r) * N + n0;
        const float* a = acc + r * kPanel;
        for (int64_t j = 0; j < width; ++j) o[j] = static_cast<O>(a[j] + (bias ? bias[n0 + j] : 0.0f));
      }
    }
  }
}

struct Operands {
  at::Tensor x;     // (M, K) fp32, contiguous
  at::Tensor bias;  // (N,) fp32, or undefined
  at::Tensor out;   // (M, N) in the input's dtype
};

Operands operands(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias, int64_t n) {
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "skinny_linear: CPU tensors");
  TORCH_CHECK(x.dim() == 2, "skinny_linear: x (M, K), not ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "skinny_linear: x in fp32 or bf16, not ",
              x.scalar_type());
  TORCH_CHECK(packed.scalar_type() == at::kFloat || packed.scalar_type() == at::kBFloat16,
              "skinny_linear: packed weights in fp32 or bf16, not ", packed.scalar_type());
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kPanel && packed.size(1) == x.size(1) && packed.is_contiguous(),
              "skinny_linear: packed (P, ", x.size(1), ", ", kPanel, ") contiguous, not ", packed.sizes());
  TORCH_CHECK(n > (packed.size(0) - 1) * kPanel && n <= packed.size(0) * kPanel, "skinny_linear: ", n,
              " outputs do not fill ", packed.size(0), " panels of ", kPanel);
  Operands ops;
  ops.x = x.to(at::kFloat).contiguous();
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, "skinny_linear: bias (", n, ",), not ", bias->sizes());
    ops.bias = bias->to(at::kFloat).contiguous();
  }
  ops.out = at::empty({x.size(0), n}, x.options());
  return ops;
}

template <typename W, typename O>
void run_typed(const Operands& ops, const at::Tensor& packed, int64_t p0, int64_t p1) {
  const int64_t M = ops.x.size(0), K = ops.x.size(1), N = ops.out.size(1);
  panels<W, O>(ops.x.data_ptr<float>(), M, K, packed.data_ptr<W>(), ops.bias.defined() ? ops.bias.data_ptr<float>() : nullptr,
               ops.out.data_ptr<O>(), N, p0, p1);
}

void run(const Operands& ops, const at::Tensor& packed, int64_t p0, int64_t p1) {
  const bool w16 = packed.scalar_type() == at::kBFloat16, o16 = ops.out.scalar_type() == at::kBFloat16;
  if (w16 && o16) return run_typed<c10::BFloat16, c10::BFloat16>(ops, packed, p0, p1);
  if (w16) return run_typed<c10::BFloat16, float>(ops, packed, p0, p1);
  if (o16) return run_typed<float, c10::BFloat16>(ops, packed, p0, p1);
  run_typed<float, float>(ops, packed, p0, p1);
}

at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                         int64_t n) {
  const Operands ops = operands(x, packed, bias, n);
  // a few panels per task: each is K x 16 weights (36 KB at K = 576 in fp32)
  at::parallel_for(0, packed.size(0), 4, [&](int64_t p0, int64_t p1) { run(ops, packed, p0, p1); });
  return ops.out;
}

// The same with the first half of the panels on the calling thread and the rest on the helper's.
at::Tensor skinny_halves(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                         int64_t n) {
  const Operands ops = operands(x, packed, bias, n);
  const int64_t panels = packed.size(0), half = (panels + 1) / 2;
  workbench_cpu::run_both([&] { run(ops, packed, 0, half); }, [&] { run(ops, packed, half, panels); });
  return ops.out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(workbench_cpu, m) {
  m.def("skinny_linear(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor", skinny_linear);
  m.def("skinny_halves(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor", skinny_halves);
}
