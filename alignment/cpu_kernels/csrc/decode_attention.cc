// A decode step's attention for one new token per row, as a Paddle custom operator (see cpu_kernels.cc):
//   alignment_decode_attention(qkv [b, H + 2 KV, d], cos, sin [b, H + 2 KV, d], k_cache, v_cache [b, KV, W, d],
//                              column [b] int64, bias [b, W]) -> out [b, 1, H d]
// per row: RoPE on the q and k heads (x cos + rotate_half(x) sin; q's tables carry 1 / sqrt(d), fused_decode.py's
// step_rotary), the row's k and v written into the caches at its column (in place), then for each q head h
// softmax(q_h . K_g + bias) . V_g with g = h / (H / KV). It replaces fused_decode.py's dozen Paddle calls per layer
// between the q | k | v projection and the output projection (each call costs more than its arithmetic here).
// Each sum runs in one fixed order over the columns, and masked columns add exact zeros (their exp is 0, their
// cached values finite), so a row's bits depend neither on the other rows, nor on the cache's width, nor on the
// thread count.
#include "common.h"

namespace {

using alignment_kernels::check_cpu_f32;
using alignment_kernels::exp_approx;
using alignment_kernels::parallel_for;

// y = x cos + rotate_half(x) sin over one head of d floats; rotate_half as rope.py's rotate_half_matrix
void rope_head(const float* x, const float* c, const float* s, float* y, int64_t d, bool interleaved) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < d; ++i) {
    float rotated;
    if (interleaved) rotated = (i % 2 == 0) ? -x[i + 1] : x[i - 1];
    else rotated = i < half ? -x[i + half] : x[i - half];
    y[i] = x[i] * c[i] + rotated * s[i];
  }
}

struct Shape {
  int64_t heads, kv_heads, d, width;
  bool interleaved;
};

void attend_row(const float* qkv, const float* cos, const float* sin, float* k_cache, float* v_cache,
                int64_t column, const float* bias, float* out, const Shape& n, std::vector<float>& scratch) {
  const int64_t d = n.d, w = n.width, groups = n.heads / n.kv_heads;
  scratch.resize(n.heads * d + w);
  float* q = scratch.data();         // [H, d]: the roped queries
  float* p = scratch.data() + n.heads * d;  // [W]: one head's scores, then its weights
  for (int64_t h = 0; h < n.heads; ++h) rope_head(qkv + h * d, cos + h * d, sin + h * d, q + h * d, d, n.interleaved);
  for (int64_t g = 0; g < n.kv_heads; ++g) {
    const int64_t k_head = n.heads + g, v_head = n.heads + n.kv_heads + g;
    float* k_slot = k_cache + (g * w + column) * d;
    rope_head(qkv + k_head * d, cos + k_head * d, sin + k_head * d, k_slot, d, n.interleaved);
    std::memcpy(v_cache + (g * w + column) * d, qkv + v_head * d, d * sizeof(float));  // v: cos 1, sin 0
  }
  for (int64_t h = 0; h < n.heads; ++h) {
    const float* keys = k_cache + (h / groups) * w * d;
    const float* values = v_cache + (h / groups) * w * d;
    const float* qh = q + h * d;
    float m = -INFINITY;
    for (int64_t j = 0; j < w; ++j) {
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < d; ++i) dot += qh[i] * keys[j * d + i];
      p[j] = dot + bias[j];
      m = p[j] > m ? p[j] : m;
    }
    float total = 0.0f;
    for (int64_t j = 0; j < w; ++j) {
      p[j] = exp_approx(p[j] - m);
      total += p[j];
    }
    const float inv = 1.0f / total;
    float* oh = out + h * d;
    std::fill(oh, oh + d, 0.0f);
    for (int64_t j = 0; j < w; ++j) {
      const float weight = p[j] * inv;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) oh[i] += weight * values[j * d + i];
    }
  }
}

}  // namespace

std::vector<paddle::Tensor> DecodeAttentionForward(const paddle::Tensor& qkv, const paddle::Tensor& cos,
                                                   const paddle::Tensor& sin, paddle::Tensor& k_cache,
                                                   paddle::Tensor& v_cache, const paddle::Tensor& column,
                                                   const paddle::Tensor& bias, int heads, bool interleaved,
                                                   int threads) {
  for (const auto* t : {&qkv, &cos, &sin, &bias}) check_cpu_f32(*t, "decode attention's inputs");
  check_cpu_f32(k_cache, "the key cache");
  check_cpu_f32(v_cache, "the value cache");
  PD_CHECK(column.dtype() == paddle::DataType::INT64, "column must be int64");
  const auto& kv = k_cache.shape();  // [b, KV, W, d]
  PD_CHECK(kv.size() == 4 && v_cache.shape() == kv, "the caches must be [b, kv_heads, width, d] alike");
  const Shape n{heads, kv[1], kv[3], kv[2], interleaved};
  const int64_t b = kv[0], fused = n.heads + 2 * n.kv_heads;
  PD_CHECK(n.heads % n.kv_heads == 0 && n.d % 2 == 0, "heads must be a multiple of kv_heads, d even");
  PD_CHECK(qkv.shape() == std::vector<int64_t>({b, fused, n.d}) && cos.shape() == qkv.shape() &&
               sin.shape() == qkv.shape(), "qkv, cos and sin must be [b, heads + 2 kv_heads, d]");
  PD_CHECK(bias.shape() == std::vector<int64_t>({b, n.width}) && column.numel() == b,
           "bias must be [b, width] and column [b]");
  const int64_t* col = column.data<int64_t>();
  for (int64_t r = 0; r < b; ++r) PD_CHECK(col[r] >= 0 && col[r] < n.width, "a column is outside the cache");
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
