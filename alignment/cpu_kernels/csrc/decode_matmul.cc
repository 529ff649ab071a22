// A decode step's weight GEMMs (a few rows times a large weight) over weights packed once into column panels, as
// Paddle custom operators (see cpu_kernels.cc):
//   alignment_pack_panels:  W [K, N] (or [N, K] with transposed, an embedding used as the LM head) -> panels
//                           [ceil(N / 32), K, 32]: panel p holds columns 32p .. 32p + 31, row after row, the last
//                           one padded with zeros
//   alignment_panel_matmul: x [..., K] @ W -> [..., N] over the panels, no gradient (decoding runs without one)
// At 8 rows the product is bound by reading the weight from memory. MKL's sgemm, which packs W on every call, read
// it at 16-19 GB/s from DRAM on an Intel Xeon (family 6 model 207, 2 cores); streaming the panels once with a
// software prefetch 64 panel rows ahead read 25-36 GB/s (a one-off probe; bench_cpu_ops.py records the ratio).
// The inner loops are panels.h's.
#include "common.h"
#include "panels.h"

using alignment_kernels::check_cpu_f32;
using alignment_kernels::kPanel;
using alignment_kernels::panel_all_rows;
using alignment_kernels::parallel_for;

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
