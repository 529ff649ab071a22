// Helpers shared by the kernels' sources: a vectorisable exp, the row split over an OpenMP team, a row's max, the
// RMSNorm and SwiGLU rows (cpu_kernels.cc's operators and decode_layer.cc compute them with this one code, so the
// two give the same bits), and the input check.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "paddle/extension.h"

namespace alignment_kernels {

// exp(x) with Cephes' expf polynomial (about 1 ulp on [-87, 88]), branch-free so loops over it vectorise; 0 below
// -87.3 (and for -inf), NaN stays NaN
inline float exp_approx(float x) {
  float xc = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  float k = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x < -87.3f ? 0.0f : y * scale;
}

constexpr int64_t kMinFloatsPerThread = 1 << 15;  // below this much work a second thread costs more than it saves

// f(begin, end) over [0, n) split into contiguous blocks, one per thread of an OpenMP team of at most `threads`
// (thread 0, the caller, taking the first); each block at least kMinFloatsPerThread / floats_per_item items (a
// decode step's rows of 8 x 576 run on the calling thread). The team is the OpenMP runtime's, the one MKL's GEMMs
// run on (Paddle's libiomp5, build.py), so its workers are still awake after a GEMM (KMP_BLOCKTIME, cpu_env.py).
template <class F>
inline void parallel_for(int64_t n, int64_t threads, F f, int64_t floats_per_item) {
  const int64_t most = std::max<int64_t>(1, n * floats_per_item / kMinFloatsPerThread);
  threads = std::max<int64_t>(1, std::min<int64_t>({threads, n, most}));
  if (threads == 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t team = omp_get_num_threads(), t = omp_get_thread_num();  // the runtime may give fewer
    const int64_t block = (n + team - 1) / team;
    const int64_t begin = std::min(n, t * block), end = std::min(n, (t + 1) * block);
    if (begin < end) f(begin, end);
  }
}

inline float row_max(const float* __restrict z, int64_t v) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < v; ++i) m = z[i] > m ? z[i] : m;
  return m;
}

// out = (x * rs) * w with rs = 1 / sqrt(mean(x^2) + eps) over one row of h floats; returns rs
inline float rms_norm_row(const float* __restrict x, const float* __restrict w, float* __restrict out, int64_t h,
                          float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < h; ++i) ss += x[i] * x[i];
  const float rs = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
  for (int64_t j = 0; j < h; ++j) out[j] = (x[j] * rs) * w[j];
  return rs;
}

// o = silu(g) * u over n floats
inline void swiglu_block(const float* __restrict g, const float* __restrict u, float* __restrict o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + exp_approx(-g[i])) * u[i];
}

inline void check_cpu_f32(const paddle::Tensor& t, const char* name) {
  PD_CHECK(t.is_cpu(), name, " must be a CPU tensor");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, name, " must be float32");
}

}  // namespace alignment_kernels
