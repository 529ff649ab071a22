// CPU kernels for the element-wise and row-reduction steps of a training / scoring step, as Paddle custom
// operators (paddle/extension.h: PD_BUILD_OP / PD_BUILD_GRAD_OP), built just in time by alignment/cpu_kernels/build.py
// with -O3 -march=native -fopenmp so the compiler vectorises the loops below for this CPU (AVX-512 where it has
// it; the row sums are `omp simd` reductions: one partial sum per vector lane). Each kernel splits its rows over an
// OpenMP team of `threads` (common.h parallel_for; the caller passes the usable cores, whatever OMP_NUM_THREADS
// says: Paddle's own OpenMP loops run on one thread under alignment/cpu_env.py). float32 only; the Python side
// sends anything else to Paddle's ops.
//   token_logprobs: log softmax(z)[label] (clipped as Paddle's, at z - max >= -64), the entropy, the row's max and
//                   log-sum; backward g (onehot - softmax)
//   rms_norm:       x * rsqrt(mean(x^2) + eps) * w, and 1 / rms; backward dx and dw
//   swiglu:         silu(gate) * up; backward d gate and d up
#include "common.h"

namespace {

using alignment_kernels::check_cpu_f32;
using alignment_kernels::exp_approx;
using alignment_kernels::parallel_for;
using alignment_kernels::rms_norm_row;
using alignment_kernels::row_max;
using alignment_kernels::swiglu_block;

// out = -g * softmax(row) = -g * e^((row - m) - log S): the softmax part of d log p(label) / d row (m and log S
// apart: m + log S rounds at large logits, row - m does not)
void softmax_grad_row(const float* __restrict row, float* __restrict out, int64_t v, float g, float m, float log_s) {
  for (int64_t i = 0; i < v; ++i) out[i] = -g * exp_approx((row[i] - m) - log_s);
}

// S = sum e^(z - m) and T = sum e^(z - m) (z - m) over a row (terms whose e is 0 left out: -inf logits)
void exp_sums_row(const float* __restrict row, int64_t v, float m, float* s_out, float* t_out) {
  float s = 0.0f, t = 0.0f;
#pragma omp simd reduction(+ : s, t)
  for (int64_t i = 0; i < v; ++i) {
    const float d = row[i] - m, e = exp_approx(d);
    s += e;
    t += e > 0.0f ? e * d : 0.0f;
  }
  *s_out = s;
  *t_out = t;
}

void swiglu_grad_block(const float* __restrict g, const float* __restrict u, const float* __restrict d,
                       float* __restrict dg, float* __restrict du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + exp_approx(-g[i]));  // sigmoid(gate)
    du[i] = d[i] * g[i] * s;
    dg[i] = d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}

constexpr int64_t kBlockRows = 32;     // rows per partial sum of RMSNorm's weight gradient
constexpr float kMinShifted = -64.0f;  // Paddle's cross-entropy clips z - max(z) here before its log

// dx of one row (x_hat = x rs, c = mean(dy w x_hat): dx = rs (dy w - x_hat c)), and dy x_hat added to dw
void rms_norm_grad_row(const float* __restrict x, const float* __restrict dy, const float* __restrict w,
                       float* __restrict dx, float* __restrict dw, int64_t h, float rs) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t i = 0; i < h; ++i) dot += dy[i] * w[i] * (x[i] * rs);
  const float c = dot / static_cast<float>(h);
  for (int64_t j = 0; j < h; ++j) {
    const float xhat = x[j] * rs;
    dx[j] = rs * (dy[j] * w[j] - xhat * c);
    dw[j] += dy[j] * xhat;
  }
}

}  // namespace

// ---- token log-probs over the vocabulary: logits [N, V] float32, labels [N] int64 (< 0: ignored, log p 0) ----

std::vector<paddle::Tensor> TokenLogprobsForward(const paddle::Tensor& logits, const paddle::Tensor& labels,
                                                 int threads) {
  check_cpu_f32(logits, "logits");
  PD_CHECK(labels.dtype() == paddle::DataType::INT64, "labels must be int64");
  const int64_t n = logits.shape()[0], v = logits.shape()[1];
  PD_CHECK(labels.numel() == n, "labels must have one id per row of logits");
  auto logp = paddle::empty({n}, paddle::DataType::FLOAT32, paddle::CPUPlace());      // [N]
  auto entropy = paddle::empty({n}, paddle::DataType::FLOAT32, paddle::CPUPlace());   // [N]
  auto stats = paddle::empty({n, 2}, paddle::DataType::FLOAT32, paddle::CPUPlace());  // [N, 2]: max, log S
  const float* z = logits.data<float>();
  const int64_t* y = labels.data<int64_t>();
  float *lp = logp.data<float>(), *h = entropy.data<float>(), *st = stats.data<float>();
  parallel_for(n, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = z + r * v;
      const float m = row_max(row, v);
      float ssum, tsum;
      exp_sums_row(row, v, m, &ssum, &tsum);  // the second pass reads the row from cache
      const float log_s = std::log(ssum);
      st[2 * r] = m;
      st[2 * r + 1] = log_s;
      h[r] = log_s - tsum / ssum;  // -sum p log p with log p = d - log S
      const int64_t label = y[r];
      // as Paddle's softmax (its ValueClip): the shifted logit at least -64, so log p >= -64 - log S, never -inf
      lp[r] = (label >= 0 && label < v) ? std::max(row[label] - m, kMinShifted) - log_s : 0.0f;
    }
  }, v);
  return {logp, entropy, stats};
}

std::vector<paddle::Tensor> TokenLogprobsBackward(const paddle::Tensor& logits, const paddle::Tensor& labels,
                                                  const paddle::Tensor& stats, const paddle::Tensor& grad_logp,
                                                  int threads) {
  check_cpu_f32(grad_logp, "the gradient of log p");
  const int64_t n = logits.shape()[0], v = logits.shape()[1];
  auto grad = paddle::empty({n, v}, paddle::DataType::FLOAT32, paddle::CPUPlace());  // [N, V]
  const float *z = logits.data<float>(), *st = stats.data<float>(), *g = grad_logp.data<float>();
  const int64_t* y = labels.data<int64_t>();
  float* dz = grad.data<float>();
  parallel_for(n, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = z + r * v;
      float* out = dz + r * v;
      const int64_t label = y[r];
      if (label < 0 || label >= v) {
        std::memset(out, 0, sizeof(float) * v);
        continue;
      }
      softmax_grad_row(row, out, v, g[r], st[2 * r], st[2 * r + 1]);
      out[label] += g[r];
    }
  }, v);
  return {grad};
}

std::vector<std::vector<int64_t>> TokenLogprobsShape(const std::vector<int64_t>& logits,
                                                     const std::vector<int64_t>& labels) {
  return {{logits[0]}, {logits[0]}, {logits[0], 2}};
}

std::vector<paddle::DataType> TokenLogprobsDtype(const paddle::DataType& logits, const paddle::DataType& labels) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

PD_BUILD_OP(alignment_token_logprobs)
    .Inputs({"Logits", "Labels"})
    .Outputs({"LogP", "Entropy", "Stats"})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(TokenLogprobsForward))
    .SetInferShapeFn(PD_INFER_SHAPE(TokenLogprobsShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(TokenLogprobsDtype));

PD_BUILD_GRAD_OP(alignment_token_logprobs)
    .Inputs({"Logits", "Labels", "Stats", paddle::Grad("LogP")})
    .Outputs({paddle::Grad("Logits")})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(TokenLogprobsBackward));

// ---- RMSNorm: x [N, H] float32, weight [H] -> y [N, H], rstd [N] = 1 / sqrt(mean(x^2) + eps) ----

std::vector<paddle::Tensor> RmsNormForward(const paddle::Tensor& x, const paddle::Tensor& weight, float eps,
                                           int threads) {
  check_cpu_f32(x, "x");
  check_cpu_f32(weight, "weight");
  const int64_t hdim = x.shape().back(), n = x.numel() / hdim;
  PD_CHECK(weight.numel() == hdim, "weight must have the last dimension of x");
  auto y = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());   // [..., H]
  auto rstd = paddle::empty({n}, paddle::DataType::FLOAT32, paddle::CPUPlace());      // [N]
  const float *px = x.data<float>(), *w = weight.data<float>();
  float *py = y.data<float>(), *pr = rstd.data<float>();
  parallel_for(n, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) pr[r] = rms_norm_row(px + r * hdim, w, py + r * hdim, hdim, eps);
  }, hdim);
  return {y, rstd};
}

std::vector<paddle::Tensor> RmsNormBackward(const paddle::Tensor& x, const paddle::Tensor& weight,
                                            const paddle::Tensor& rstd, const paddle::Tensor& grad_y, float eps,
                                            int threads) {
  check_cpu_f32(grad_y, "the gradient of y");
  const int64_t hdim = x.shape().back(), n = x.numel() / hdim;
  auto dx = paddle::empty(x.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());  // [..., H]
  auto dw = paddle::empty({hdim}, paddle::DataType::FLOAT32, paddle::CPUPlace());     // [H]
  const float *px = x.data<float>(), *w = weight.data<float>(), *pr = rstd.data<float>(), *g = grad_y.data<float>();
  float *pdx = dx.data<float>(), *pdw = dw.data<float>();
  // dw sums rows in fixed blocks of kBlockRows, then the blocks in order: the same bits on any thread count
  const int64_t blocks = (n + kBlockRows - 1) / kBlockRows;
  std::vector<float> partial(blocks * hdim, 0.0f);  // [blocks, H]: each block's share of dw
  parallel_for(blocks, threads, [&](int64_t first, int64_t last) {
    for (int64_t r = first * kBlockRows; r < std::min(n, last * kBlockRows); ++r) {
      float* dwp = partial.data() + (r / kBlockRows) * hdim;
      const float *row = px + r * hdim, *gr = g + r * hdim;
      rms_norm_grad_row(row, gr, w, pdx + r * hdim, dwp, hdim, pr[r]);
    }
  }, kBlockRows * hdim);
  for (int64_t j = 0; j < hdim; ++j) pdw[j] = 0.0f;
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t j = 0; j < hdim; ++j) pdw[j] += partial[b * hdim + j];
  return {dx, dw};
}

std::vector<std::vector<int64_t>> RmsNormShape(const std::vector<int64_t>& x, const std::vector<int64_t>& weight) {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < x.size(); ++i) n *= x[i];
  return {x, {n}};
}

std::vector<paddle::DataType> RmsNormDtype(const paddle::DataType& x, const paddle::DataType& weight) {
  return {paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

PD_BUILD_OP(alignment_rms_norm)
    .Inputs({"X", "Weight"})
    .Outputs({"Y", "Rstd"})
    .Attrs({"eps: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(RmsNormForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormDtype));

PD_BUILD_GRAD_OP(alignment_rms_norm)
    .Inputs({"X", "Weight", "Rstd", paddle::Grad("Y")})
    .Outputs({paddle::Grad("X"), paddle::Grad("Weight")})
    .Attrs({"eps: float", "threads: int"})
    .SetKernelFn(PD_KERNEL(RmsNormBackward));

// ---- SwiGLU: silu(gate) * up, gate and up of one shape, float32 ----

std::vector<paddle::Tensor> SwigluForward(const paddle::Tensor& gate, const paddle::Tensor& up, int threads) {
  check_cpu_f32(gate, "gate");
  check_cpu_f32(up, "up");
  PD_CHECK(gate.shape() == up.shape(), "gate and up must have one shape");
  const int64_t n = gate.numel();
  auto out = paddle::empty(gate.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());  // gate's shape
  const float *g = gate.data<float>(), *u = up.data<float>();
  float* o = out.data<float>();
  parallel_for((n + 63) / 64, threads, [&](int64_t begin, int64_t end) {  // blocks of 64 elements
    swiglu_block(g + begin * 64, u + begin * 64, o + begin * 64, std::min(n, end * 64) - begin * 64);
  }, 64);
  return {out};
}

std::vector<paddle::Tensor> SwigluBackward(const paddle::Tensor& gate, const paddle::Tensor& up,
                                           const paddle::Tensor& grad_out, int threads) {
  check_cpu_f32(grad_out, "the gradient of the output");
  const int64_t n = gate.numel();
  auto dgate = paddle::empty(gate.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  auto dup = paddle::empty(gate.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float *g = gate.data<float>(), *u = up.data<float>(), *d = grad_out.data<float>();
  float *dg = dgate.data<float>(), *du = dup.data<float>();
  parallel_for((n + 63) / 64, threads, [&](int64_t begin, int64_t end) {
    const int64_t at = begin * 64;
    swiglu_grad_block(g + at, u + at, d + at, dg + at, du + at, std::min(n, end * 64) - at);
  }, 64);
  return {dgate, dup};
}

std::vector<std::vector<int64_t>> SwigluShape(const std::vector<int64_t>& gate, const std::vector<int64_t>& up) {
  return {gate};
}

std::vector<paddle::DataType> SwigluDtype(const paddle::DataType& gate, const paddle::DataType& up) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(alignment_swiglu)
    .Inputs({"Gate", "Up"})
    .Outputs({"Out"})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(SwigluForward))
    .SetInferShapeFn(PD_INFER_SHAPE(SwigluShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(SwigluDtype));

PD_BUILD_GRAD_OP(alignment_swiglu)
    .Inputs({"Gate", "Up", paddle::Grad("Out")})
    .Outputs({paddle::Grad("Gate"), paddle::Grad("Up")})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(SwigluBackward));
