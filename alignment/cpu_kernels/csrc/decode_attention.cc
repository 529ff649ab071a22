// A decode step's attention for one new token per row, as a Paddle custom operator (see cpu_kernels.cc):
//   alignment_decode_attention(qkv [b, H + 2 KV, d], cos, sin [b, H + 2 KV, d], k_cache, v_cache [b, KV, W, d],
//                              column [b] int64, bias [b, W]) -> out [b, 1, H d]
// per row: RoPE on the q and k heads (x cos + rotate_half(x) sin; q's tables carry 1 / sqrt(d), fused_decode.py's
// step_rotary), the row's k and v written into the caches at its column (in place), then for each q head h
// softmax(q_h . K_g + bias) . V_g with g = h / (H / KV). It replaces fused_decode.py's dozen Paddle calls per layer
// between the q | k | v projection and the output projection (each call costs more than its arithmetic here).
// The row's loops are attention_row.h's; masked columns add exact zeros (their exp is 0, their cached values finite).
#include "attention_row.h"

using alignment_kernels::check_cpu_f32;
using alignment_kernels::attend_row;
using alignment_kernels::checked_attention_shape;
using alignment_kernels::Shape;
using alignment_kernels::parallel_for;

std::vector<paddle::Tensor> DecodeAttentionForward(const paddle::Tensor& qkv, const paddle::Tensor& cos,
                                                   const paddle::Tensor& sin, paddle::Tensor& k_cache,
                                                   paddle::Tensor& v_cache, const paddle::Tensor& column,
                                                   const paddle::Tensor& bias, int heads, bool interleaved,
                                                   int threads) {
  for (const auto* t : {&qkv, &cos, &sin}) check_cpu_f32(*t, "decode attention's inputs");
  const Shape n = checked_attention_shape(k_cache, v_cache, column, bias, heads, interleaved);
  const int64_t b = k_cache.shape()[0], fused = n.heads + 2 * n.kv_heads;
  PD_CHECK(qkv.shape() == std::vector<int64_t>({b, fused, n.d}) && cos.shape() == qkv.shape() &&
               sin.shape() == qkv.shape(), "qkv, cos and sin must be [b, heads + 2 kv_heads, d]");
  const int64_t* col = column.data<int64_t>();
  auto out = paddle::empty({b, 1, n.heads * n.d}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float *pq = qkv.data<float>(), *pc = cos.data<float>(), *ps = sin.data<float>(), *pb = bias.data<float>();
  float *pk = k_cache.data<float>(), *pv = v_cache.data<float>(), *po = out.data<float>();
  const int64_t row_cache = n.kv_heads * n.width * n.d, row_qkv = fused * n.d;
  parallel_for(b, threads, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t r = begin; r < end; ++r)
      attend_row(pq + r * row_qkv, pc + r * row_qkv, ps + r * row_qkv, pk + r * row_cache, pv + r * row_cache,
                 col[r], pb + r * n.width, po + r * n.heads * n.d, n, scratch);
  }, 2 * n.heads * n.width * n.d);
  return {out};
}

std::vector<std::vector<int64_t>> DecodeAttentionShape(
    const std::vector<int64_t>& qkv, const std::vector<int64_t>& cos, const std::vector<int64_t>& sin,
    const std::vector<int64_t>& k_cache, const std::vector<int64_t>& v_cache, const std::vector<int64_t>& column,
    const std::vector<int64_t>& bias, int heads, bool interleaved, int threads) {
  return {{qkv[0], 1, heads * qkv[2]}};
}

std::vector<paddle::DataType> DecodeAttentionDtype(const paddle::DataType& qkv, const paddle::DataType& cos,
                                                   const paddle::DataType& sin, const paddle::DataType& k_cache,
                                                   const paddle::DataType& v_cache, const paddle::DataType& column,
                                                   const paddle::DataType& bias) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(alignment_decode_attention)
    .Inputs({"QKV", "Cos", "Sin", "KCache", "VCache", "Column", "Bias"})
    .Outputs({"Out", "KCacheOut", "VCacheOut"})
    .SetInplaceMap({{"KCache", "KCacheOut"}, {"VCache", "VCacheOut"}})
    .Attrs({"heads: int", "interleaved: bool", "threads: int"})
    .SetKernelFn(PD_KERNEL(DecodeAttentionForward))
    .SetInferShapeFn(PD_INFER_SHAPE(DecodeAttentionShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(DecodeAttentionDtype));
