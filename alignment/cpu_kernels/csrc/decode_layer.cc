// One decoder layer of a decode step in one call, as a Paddle custom operator (see cpu_kernels.cc):
//   alignment_decode_layer(x [b, 1, H], input_norm [H], qkv, cos, sin [b, NH + 2 KV, d], k_cache, v_cache
//                          [b, KV, W, d], column [b] int64, bias [b, W], o, post_norm [H], gate, up, down)
//     -> [b, 1, H]: x1 + down(silu(gate(h1)) * up(h1)) with h1 = RMSNorm(x1), x1 = x + o(attention(RMSNorm(x)));
//        the row's k and v written into the caches at its column (in place)
// qkv, o, gate, up and down are weights packed into column panels (decode_matmul.cc's alignment_pack_panels).
// It is fused_decode.py's `_kernel_layer` over the separate kernels (rms_norm, panel_matmul, decode_attention,
// swiglu) with their row functions (common.h, panels.h, attention_row.h): the same bits as those kernels called one
// by one. What goes is the dozen Paddle calls of a layer and a parallel region per kernel: the layer's OpenMP team
// meets at a barrier between the phases. Every phase splits panels (or rows) into contiguous blocks, and each
// output is computed whole by one thread, so the bits do not depend on the thread count.
#include <utility>

#include "attention_row.h"
#include "panels.h"

using alignment_kernels::attend_row;
using alignment_kernels::check_cpu_f32;
using alignment_kernels::checked_attention_shape;
using alignment_kernels::kMinFloatsPerThread;
using alignment_kernels::kPanel;
using alignment_kernels::panel_all_rows;
using alignment_kernels::rms_norm_row;
using alignment_kernels::Shape;
using alignment_kernels::swiglu_block;

namespace {

struct Packed {
  const float* data;
  int64_t k, n, panels;
};

Packed packed(const paddle::Tensor& t, int64_t k, int64_t n, const char* name) {
  check_cpu_f32(t, name);
  const auto& s = t.shape();
  PD_CHECK(s.size() == 3 && s[0] == (n + kPanel - 1) / kPanel && s[1] == k && s[2] == kPanel, name,
           " must be the panels [ceil(N / 32), K, 32] of its weight [K, N]");
  return {t.data<float>(), k, n, s[0]};
}

// [begin, end) of n items for thread t of `threads`: contiguous blocks, as common.h's parallel_for
std::pair<int64_t, int64_t> share(int64_t n, int64_t t, int64_t threads) {
  const int64_t block = (n + threads - 1) / threads;
  return {std::min(n, t * block), std::min(n, (t + 1) * block)};
}

// y[:, the columns of panels [begin, end)] = x [m, w.k] @ w (y's row stride w.n); -> those columns
std::pair<int64_t, int64_t> gemm_share(const float* x, int64_t m, const Packed& w, float* y, int64_t t,
                                       int64_t threads) {
  const auto [begin, end] = share(w.panels, t, threads);
  for (int64_t p = begin; p < end; ++p)
    panel_all_rows(x, m, w.k, w.data + p * w.k * kPanel, y + p * kPanel, w.n, std::min(kPanel, w.n - p * kPanel));
  return {begin * kPanel, std::min(w.n, end * kPanel)};
}

}  // namespace

std::vector<paddle::Tensor> DecodeLayerForward(
    const paddle::Tensor& x, const paddle::Tensor& input_norm, const paddle::Tensor& qkv_w,
    const paddle::Tensor& cos, const paddle::Tensor& sin, paddle::Tensor& k_cache, paddle::Tensor& v_cache,
    const paddle::Tensor& column, const paddle::Tensor& bias, const paddle::Tensor& o_w,
    const paddle::Tensor& post_norm, const paddle::Tensor& gate_w, const paddle::Tensor& up_w,
    const paddle::Tensor& down_w, int heads, bool interleaved, float eps, int threads) {
  for (const auto* t : {&x, &input_norm, &cos, &sin, &post_norm}) check_cpu_f32(*t, "decode layer's inputs");
  const Shape n = checked_attention_shape(k_cache, v_cache, column, bias, heads, interleaved);
  const int64_t b = k_cache.shape()[0], hidden = x.shape().back(), fused = (n.heads + 2 * n.kv_heads) * n.d;
  PD_CHECK(x.numel() == b * hidden && input_norm.numel() == hidden && post_norm.numel() == hidden,
           "x must be [b, 1, hidden] and the norm weights [hidden]");
  PD_CHECK(cos.numel() == b * fused && sin.numel() == b * fused, "cos and sin must be [b, heads + 2 kv_heads, d]");
  const int64_t inner = down_w.shape().size() == 3 ? down_w.shape()[1] : 0;  // the MLP's intermediate size
  const Packed qkv = packed(qkv_w, hidden, fused, "qkv"), o = packed(o_w, n.heads * n.d, hidden, "o"),
               gate = packed(gate_w, hidden, inner, "gate"), up = packed(up_w, hidden, inner, "up"),
               down = packed(down_w, inner, hidden, "down");
  const int64_t* col = column.data<int64_t>();

  auto out = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());  // [b, 1, H]
  const float *px = x.data<float>(), *pc = cos.data<float>(), *ps = sin.data<float>(), *pb = bias.data<float>();
  const float *in_w = input_norm.data<float>(), *post_w = post_norm.data<float>();
  float *pk = k_cache.data<float>(), *pv = v_cache.data<float>(), *po = out.data<float>();
  std::vector<float> h(b * hidden), q(b * fused), attended(b * n.heads * n.d), x1(b * hidden), y(b * hidden),
      g(b * inner), u(b * inner), a(b * inner);
  const int64_t weights = qkv.k * qkv.n + o.k * o.n + 2 * gate.k * gate.n + down.k * down.n;
  const int64_t team = std::max<int64_t>(1, std::min<int64_t>(threads, weights / kMinFloatsPerThread));
  const int64_t row_cache = n.kv_heads * n.width * n.d;

  auto run = [&](int64_t t, int64_t team) {  // thread t of `team`; they meet at a barrier between the phases
    if (t == 0)  // the input norm: a few rows, on one thread
      for (int64_t r = 0; r < b; ++r) rms_norm_row(px + r * hidden, in_w, &h[r * hidden], hidden, eps);
#pragma omp barrier
    gemm_share(h.data(), b, qkv, q.data(), t, team);  // q | k | v
#pragma omp barrier
    const auto [first, last] = share(b, t, team);  // attention, row by row
    std::vector<float> scratch;
    for (int64_t r = first; r < last; ++r)
      attend_row(&q[r * fused], pc + r * fused, ps + r * fused, pk + r * row_cache, pv + r * row_cache, col[r],
                 pb + r * n.width, &attended[r * n.heads * n.d], n, scratch);
#pragma omp barrier
    const auto [o0, o1] = gemm_share(attended.data(), b, o, y.data(), t, team);  // x1 = x + o(attention)
    for (int64_t r = 0; r < b; ++r)
      for (int64_t j = o0; j < o1; ++j) x1[r * hidden + j] = px[r * hidden + j] + y[r * hidden + j];
#pragma omp barrier
    if (t == 0)
      for (int64_t r = 0; r < b; ++r) rms_norm_row(&x1[r * hidden], post_w, &h[r * hidden], hidden, eps);
#pragma omp barrier
    const auto [m0, m1] = gemm_share(h.data(), b, gate, g.data(), t, team);  // SwiGLU on this thread's columns
    gemm_share(h.data(), b, up, u.data(), t, team);
    for (int64_t r = 0; r < b; ++r)
      swiglu_block(&g[r * inner + m0], &u[r * inner + m0], &a[r * inner + m0], m1 - m0);
#pragma omp barrier
    const auto [d0, d1] = gemm_share(a.data(), b, down, y.data(), t, team);  // out = x1 + down(a)
    for (int64_t r = 0; r < b; ++r)
      for (int64_t j = d0; j < d1; ++j) po[r * hidden + j] = x1[r * hidden + j] + y[r * hidden + j];
  };
  if (team == 1) {
    run(0, 1);
  } else {
#pragma omp parallel num_threads(team)  // the OpenMP runtime's team, MKL's (common.h parallel_for)
    run(omp_get_thread_num(), omp_get_num_threads());
  }
  return {out};
}

std::vector<std::vector<int64_t>> DecodeLayerShape(
    const std::vector<int64_t>& x, const std::vector<int64_t>& input_norm, const std::vector<int64_t>& qkv,
    const std::vector<int64_t>& cos, const std::vector<int64_t>& sin, const std::vector<int64_t>& k_cache,
    const std::vector<int64_t>& v_cache, const std::vector<int64_t>& column, const std::vector<int64_t>& bias,
    const std::vector<int64_t>& o, const std::vector<int64_t>& post_norm, const std::vector<int64_t>& gate,
    const std::vector<int64_t>& up, const std::vector<int64_t>& down, int heads, bool interleaved, float eps,
    int threads) {
  return {x};
}

std::vector<paddle::DataType> DecodeLayerDtype(
    const paddle::DataType& x, const paddle::DataType& input_norm, const paddle::DataType& qkv,
    const paddle::DataType& cos, const paddle::DataType& sin, const paddle::DataType& k_cache,
    const paddle::DataType& v_cache, const paddle::DataType& column, const paddle::DataType& bias,
    const paddle::DataType& o, const paddle::DataType& post_norm, const paddle::DataType& gate,
    const paddle::DataType& up, const paddle::DataType& down) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(alignment_decode_layer)
    .Inputs({"X", "InputNorm", "QKV", "Cos", "Sin", "KCache", "VCache", "Column", "Bias", "O", "PostNorm", "Gate",
             "Up", "Down"})
    .Outputs({"Out", "KCacheOut", "VCacheOut"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}})
    .Attrs({"heads: int", "interleaved: bool", "eps: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(DecodeLayerForward))
    .SetInferShapeFn(PD_INFER_SHAPE(DecodeLayerShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecodeLayerDtype));
