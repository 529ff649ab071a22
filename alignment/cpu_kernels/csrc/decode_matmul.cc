// A decode step's weight GEMMs (a few rows times a large weight) over weights packed once into column panels, as
// Paddle custom operators (see cpu_kernels.cc):
//   alignment_pack_panels:  W [K, N] (or [N, K] with transposed, an embedding used as the LM head) -> panels
//                           [ceil(N / 32), K, 32]: panel p holds columns 32p .. 32p + 31, row after row, the last
//                           one padded with zeros
//   alignment_panel_matmul: x [..., K] @ W -> [..., N] over the panels, no gradient (decoding runs without one)
// At 8 rows the product is bound by reading the weight from memory. MKL's sgemm, which packs W on every call, read
// it at 16-19 GB/s from DRAM on an Intel Xeon (family 6 model 207, 2 cores); streaming the panels once with a
// software prefetch 64 panel rows ahead read 25-36 GB/s (a one-off probe; bench_cpu_ops.py records the ratio).
// Each output is one fused multiply-add chain over k = 0 .. K - 1, so a row's bits depend neither on the other rows,
// nor on the batch size, nor on the thread count.
#include "common.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using alignment_kernels::check_cpu_f32;
using alignment_kernels::parallel_for;

constexpr int64_t kPanel = 32;        // columns per panel: two 16-float vectors
constexpr int64_t kRows = 8;          // rows per pass over a panel (8 x 2 accumulators)
constexpr int64_t kPrefetchRows = 64;  // panel rows ahead (8 KB): the hardware prefetcher alone read 16 GB/s

// y[r, 0 .. cols) = x[r, :] @ panel for R rows (x row stride K, y row stride ldy), cols <= 32 of the panel valid
template <int R>
void panel_rows(const float* __restrict x, int64_t K, const float* __restrict panel, float* __restrict y,
                int64_t ldy, int64_t cols) {
#if defined(__AVX512F__)
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* w = panel + k * kPanel;
    _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchRows * kPanel), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchRows * kPanel + 16), _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * K + k]);
      acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(64) float out[kPanel];
    _mm512_store_ps(out, acc[r][0]);
    _mm512_store_ps(out + 16, acc[r][1]);
    std::memcpy(y + r * ldy, out, cols * sizeof(float));
  }
#else
  float acc[R][kPanel] = {};
  for (int64_t k = 0; k < K; ++k) {
    const float* w = panel + k * kPanel;
    for (int r = 0; r < R; ++r) {
      const float xv = x[r * K + k];
#pragma omp simd
      for (int64_t j = 0; j < kPanel; ++j) acc[r][j] = std::fma(xv, w[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(y + r * ldy, acc[r], cols * sizeof(float));
#endif
}

void panel_all_rows(const float* x, int64_t M, int64_t K, const float* panel, float* y, int64_t N, int64_t cols) {
  for (int64_t r0 = 0; r0 < M; r0 += kRows) {  // later passes read the panel from L2
    const float* xr = x + r0 * K;
    float* yr = y + r0 * N;
    switch (std::min(kRows, M - r0)) {
      case 8: panel_rows<8>(xr, K, panel, yr, N, cols); break;
      case 7: panel_rows<7>(xr, K, panel, yr, N, cols); break;
      case 6: panel_rows<6>(xr, K, panel, yr, N, cols); break;
      case 5: panel_rows<5>(xr, K, panel, yr, N, cols); break;
      case 4: panel_rows<4>(xr, K, panel, yr, N, cols); break;
      case 3: panel_rows<3>(xr, K, panel, yr, N, cols); break;
      case 2: panel_rows<2>(xr, K, panel, yr, N, cols); break;
      default: panel_rows<1>(xr, K, panel, yr, N, cols); break;
    }
  }
}

}  // namespace

std::vector<paddle::Tensor> PackPanelsForward(const paddle::Tensor& w, bool transposed, int threads) {
  check_cpu_f32(w, "the weight");
  PD_CHECK(w.shape().size() == 2, "the weight must be 2-D");
  const int64_t K = w.shape()[transposed ? 1 : 0], N = w.shape()[transposed ? 0 : 1];
  const int64_t panels = (N + kPanel - 1) / kPanel;
  auto packed = paddle::empty({panels, K, kPanel}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float* src = w.data<float>();
  float* dst = packed.data<float>();
  parallel_for(panels, threads, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t cols = std::min(kPanel, N - p * kPanel);
      for (int64_t k = 0; k < K; ++k) {
        float* row = dst + (p * K + k) * kPanel;
        if (transposed) {
          for (int64_t j = 0; j < cols; ++j) row[j] = src[(p * kPanel + j) * K + k];
        } else {
          std::memcpy(row, src + k * N + p * kPanel, cols * sizeof(float));
        }
        std::fill(row + cols, row + kPanel, 0.0f);
      }
    }
  }, K * kPanel);
  return {packed};
}

std::vector<paddle::Tensor> PanelMatmulForward(const paddle::Tensor& x, const paddle::Tensor& packed, int64_t n,
                                               int threads) {
  check_cpu_f32(x, "x");
  check_cpu_f32(packed, "the packed weight");
  PD_CHECK(packed.shape().size() == 3 && packed.shape()[2] == kPanel, "the packed weight must be [panels, K, 32]");
  const int64_t K = packed.shape()[1], panels = packed.shape()[0];
  PD_CHECK(x.shape().back() == K, "x's last axis must be the packed weight's K");
  PD_CHECK(n > (panels - 1) * kPanel && n <= panels * kPanel, "n must be the packed weight's column count");
  const int64_t M = x.numel() / K;
  std::vector<int64_t> shape = x.shape();
  shape.back() = n;
  auto y = paddle::empty(shape, paddle::DataType::FLOAT32, paddle::CPUPlace());  // [..., N]
  const float *px = x.data<float>(), *pw = packed.data<float>();
  float* py = y.data<float>();
  parallel_for(panels, threads, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      panel_all_rows(px, M, K, pw + p * K * kPanel, py + p * kPanel, n, std::min(kPanel, n - p * kPanel));
  }, K * kPanel);
  return {y};
}

std::vector<std::vector<int64_t>> PackPanelsShape(const std::vector<int64_t>& w, bool transposed, int threads) {
  const int64_t K = w[transposed ? 1 : 0], N = w[transposed ? 0 : 1];
  return {{(N + kPanel - 1) / kPanel, K, kPanel}};
}

std::vector<std::vector<int64_t>> PanelMatmulShape(const std::vector<int64_t>& x, const std::vector<int64_t>& packed,
                                                   int64_t n, int threads) {
  std::vector<int64_t> shape = x;
  shape.back() = n;
  return {shape};
}

std::vector<paddle::DataType> PackPanelsDtype(const paddle::DataType& w) { return {paddle::DataType::FLOAT32}; }

std::vector<paddle::DataType> PanelMatmulDtype(const paddle::DataType& x, const paddle::DataType& packed) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(alignment_pack_panels)
    .Inputs({"W"})
    .Outputs({"Packed"})
    .Attrs({"transposed: bool", "threads: int"})
    .SetKernelFn(PD_KERNEL(PackPanelsForward))
    .SetInferShapeFn(PD_INFER_SHAPE(PackPanelsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PackPanelsDtype));

PD_BUILD_OP(alignment_panel_matmul)
    .Inputs({"X", "Packed"})
    .Outputs({"Y"})
    .Attrs({"n: int64_t", "threads: int"})
    .SetKernelFn(PD_KERNEL(PanelMatmulForward))
    .SetInferShapeFn(PD_INFER_SHAPE(PanelMatmulShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(PanelMatmulDtype));
