// A decode step's attention for one row (decode_attention.cc's operator and decode_layer.cc): RoPE on the row's q
// and k heads, its k and v written into the caches at its column, softmax(q_h . K_g + bias) . V_g per q head h.
// Each sum runs in one fixed order over the columns, and masked columns add exact zeros, so a row's bits depend
// neither on the other rows, nor on the cache's width, nor on the thread count.
#pragma once

#include "common.h"

namespace alignment_kernels {

// y = x cos + rotate_half(x) sin over one head of d floats; rotate_half as rope.py's rotate_half_matrix
inline void rope_head(const float* x, const float* c, const float* s, float* y, int64_t d, bool interleaved) {
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

// The caches [b, KV, W, d] alike, column int64 [b] inside them, bias [b, W] float32: -> the attention's shape
inline Shape checked_attention_shape(const paddle::Tensor& k_cache, const paddle::Tensor& v_cache,
                                     const paddle::Tensor& column, const paddle::Tensor& bias, int64_t heads,
                                     bool interleaved) {
  check_cpu_f32(k_cache, "the key cache");
  check_cpu_f32(v_cache, "the value cache");
  check_cpu_f32(bias, "bias");
  PD_CHECK(column.dtype() == paddle::DataType::INT64, "column must be int64");
  const auto& kv = k_cache.shape();  // [b, KV, W, d]
  PD_CHECK(kv.size() == 4 && v_cache.shape() == kv, "the caches must be [b, kv_heads, width, d] alike");
  const Shape n{heads, kv[1], kv[3], kv[2], interleaved};
  PD_CHECK(n.heads % n.kv_heads == 0 && n.d % 2 == 0, "heads must be a multiple of kv_heads, d even");
  PD_CHECK(bias.shape() == std::vector<int64_t>({kv[0], n.width}) && column.numel() == kv[0],
           "bias must be [b, width] and column [b]");
  const int64_t* col = column.data<int64_t>();
  for (int64_t r = 0; r < kv[0]; ++r) PD_CHECK(col[r] >= 0 && col[r] < n.width, "a column is outside the cache");
  return n;
}

inline void attend_row(const float* qkv, const float* cos, const float* sin, float* k_cache, float* v_cache,
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

}  // namespace alignment_kernels
