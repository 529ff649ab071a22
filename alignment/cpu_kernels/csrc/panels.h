// The decode GEMM's inner loops (decode_matmul.cc's operator and decode_layer.cc): x @ a weight packed into column
// panels [ceil(N / 32), K, 32]. Each output is one fused multiply-add chain over k = 0 .. K - 1, so a row's bits
// depend neither on the other rows, nor on the batch size, nor on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace alignment_kernels {

constexpr int64_t kPanel = 32;        // columns per panel: two 16-float vectors
constexpr int64_t kPrefetchRows = 64;  // panel rows ahead (8 KB): the hardware prefetcher alone read 16 GB/s

#if defined(__AVX512F__)
constexpr int64_t kRows = 8;  // rows per pass over a panel (8 x 2 accumulators of 16 floats)

// y[r, 0 .. cols) = x[r, :] @ panel for R rows (x row stride K, y row stride ldy), cols <= 32 of the panel valid
template <int R>
inline void panel_rows(const float* __restrict x, int64_t K, const float* __restrict panel, float* __restrict y,
                       int64_t ldy, int64_t cols) {
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
}
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2 has 16 vector registers: a pass holds R <= 6 rows of one 16-column half of the panel (12 accumulators, two
// weight vectors, the broadcast), BLIS's 6 x 16 block. Over all 32 columns at once 8 rows take 32 accumulators, more
// than the registers: the decode layer kernel ran at 28-30 GFLOP/s on one thread with that loop, 53-64 with this
// block (an AMD EPYC Zen 3, family 25 model 1, 8-32 rows of the TRL peer's layer). The first half's pass prefetches
// the whole panel row; the second reads it from L2.
constexpr int64_t kRows = 6;
constexpr int64_t kHalf = 16;

#define ALIGNMENT_ROW_FMA(i)                                    \
  if constexpr (R > i) {                                        \
    const __m256 xv = _mm256_broadcast_ss(x##i + k);            \
    a##i##0 = _mm256_fmadd_ps(xv, w0, a##i##0);                 \
    a##i##1 = _mm256_fmadd_ps(xv, w1, a##i##1);                 \
  }
#define ALIGNMENT_ROW_STORE(i)                                  \
  if constexpr (R > i) {                                        \
    alignas(32) float out[kHalf];                               \
    _mm256_store_ps(out, a##i##0);                              \
    _mm256_store_ps(out + 8, a##i##1);                          \
    std::memcpy(y + i * ldy, out, cols * sizeof(float));        \
  }

// Not inlined: inlined into its callers' loops, gcc 12 also stored the accumulators to the stack on every k.
template <int R>
__attribute__((noinline)) void half_panel_rows(const float* __restrict x, int64_t K, const float* __restrict half,
                                               float* __restrict y, int64_t ldy, int64_t cols, bool prefetch) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 a00 = zero, a01 = zero, a10 = zero, a11 = zero, a20 = zero, a21 = zero, a30 = zero, a31 = zero,
         a40 = zero, a41 = zero, a50 = zero, a51 = zero;
  const float *x0 = x, *x1 = x + std::min(R - 1, 1) * K, *x2 = x + std::min(R - 1, 2) * K,  // rows past R: unused
              *x3 = x + std::min(R - 1, 3) * K, *x4 = x + std::min(R - 1, 4) * K, *x5 = x + std::min(R - 1, 5) * K;
  for (int64_t k = 0; k < K; ++k) {
    const float* w = half + k * kPanel;
    if (prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchRows * kPanel), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchRows * kPanel + 16), _MM_HINT_T0);
    }
    const __m256 w0 = _mm256_loadu_ps(w), w1 = _mm256_loadu_ps(w + 8);
    ALIGNMENT_ROW_FMA(0) ALIGNMENT_ROW_FMA(1) ALIGNMENT_ROW_FMA(2)
    ALIGNMENT_ROW_FMA(3) ALIGNMENT_ROW_FMA(4) ALIGNMENT_ROW_FMA(5)
  }
  ALIGNMENT_ROW_STORE(0) ALIGNMENT_ROW_STORE(1) ALIGNMENT_ROW_STORE(2)
  ALIGNMENT_ROW_STORE(3) ALIGNMENT_ROW_STORE(4) ALIGNMENT_ROW_STORE(5)
}
#undef ALIGNMENT_ROW_FMA
#undef ALIGNMENT_ROW_STORE

template <int R>
inline void panel_rows(const float* __restrict x, int64_t K, const float* __restrict panel, float* __restrict y,
                       int64_t ldy, int64_t cols) {
  half_panel_rows<R>(x, K, panel, y, ldy, std::min(kHalf, cols), true);
  if (cols > kHalf) half_panel_rows<R>(x, K, panel + kHalf, y + kHalf, ldy, cols - kHalf, false);
}
#else
constexpr int64_t kRows = 8;

template <int R>
inline void panel_rows(const float* __restrict x, int64_t K, const float* __restrict panel, float* __restrict y,
                       int64_t ldy, int64_t cols) {
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
}
#endif

// y[0 .. M, 0 .. cols) = x [M, K] @ one panel, y's row stride N
inline void panel_all_rows(const float* x, int64_t M, int64_t K, const float* panel, float* y, int64_t N,
                           int64_t cols) {
  for (int64_t r0 = 0; r0 < M; r0 += kRows) {  // later passes read the panel from L2
    const float* xr = x + r0 * K;
    float* yr = y + r0 * N;
    switch (std::min(kRows, M - r0)) {
      case 8: panel_rows<8>(xr, K, panel, yr, N, cols); break;  // (kRows 8 only)
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

}  // namespace alignment_kernels
