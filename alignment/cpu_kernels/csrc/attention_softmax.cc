// Attention's softmax with its additive mask in one pass, as a Paddle custom operator (see cpu_kernels.cc):
//   attention_softmax: y = softmax(scores + bias) over the last axis, scores and bias of one shape [..., T] (the
//                      model expands its mask to the scores' shape, llama.py attention_bias); backward
//                      d scores = y (dy - sum(dy y)), the bias taking no gradient (a mask)
// Rows are independent, so a row's bits do not depend on the thread count or on the other rows.
#include "common.h"

namespace {

using alignment_kernels::check_cpu_f32;
using alignment_kernels::exp_approx;
using alignment_kernels::parallel_for;

void softmax_row(const float* __restrict x, const float* __restrict b, float* __restrict y, int64_t t) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < t; ++i) {
    y[i] = x[i] + b[i];
    m = y[i] > m ? y[i] : m;
  }
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < t; ++i) {
    y[i] = exp_approx(y[i] - m);
    s += y[i];
  }
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < t; ++i) y[i] *= inv;
}

void softmax_grad_row(const float* __restrict y, const float* __restrict dy, float* __restrict dx, int64_t t) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (int64_t i = 0; i < t; ++i) dot += dy[i] * y[i];
  for (int64_t i = 0; i < t; ++i) dx[i] = y[i] * (dy[i] - dot);
}

}  // namespace

std::vector<paddle::Tensor> AttentionSoftmaxForward(const paddle::Tensor& scores, const paddle::Tensor& bias,
                                                    int threads) {
  check_cpu_f32(scores, "scores");
  check_cpu_f32(bias, "bias");
  PD_CHECK(scores.shape() == bias.shape(), "scores and bias must have one shape");
  const int64_t t = scores.shape().back(), rows = scores.numel() / t;
  auto y = paddle::empty(scores.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());  // [..., T]
  const float *x = scores.data<float>(), *b = bias.data<float>();
  float* py = y.data<float>();
  parallel_for(rows, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) softmax_row(x + r * t, b + r * t, py + r * t, t);
  }, t);
  return {y};
}

std::vector<paddle::Tensor> AttentionSoftmaxBackward(const paddle::Tensor& y, const paddle::Tensor& grad_y,
                                                     int threads) {
  check_cpu_f32(grad_y, "the gradient of the attention weights");
  const int64_t t = y.shape().back(), rows = y.numel() / t;
  auto dx = paddle::empty(y.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());  // [..., T]
  const float *py = y.data<float>(), *g = grad_y.data<float>();
  float* pdx = dx.data<float>();
  parallel_for(rows, threads, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) softmax_grad_row(py + r * t, g + r * t, pdx + r * t, t);
  }, t);
  return {dx};
}

std::vector<std::vector<int64_t>> AttentionSoftmaxShape(const std::vector<int64_t>& scores,
                                                        const std::vector<int64_t>& bias) {
  return {scores};
}

std::vector<paddle::DataType> AttentionSoftmaxDtype(const paddle::DataType& scores, const paddle::DataType& bias) {
  return {paddle::DataType::FLOAT32};
}

PD_BUILD_OP(alignment_attention_softmax)
    .Inputs({"Scores", "Bias"})
    .Outputs({"Y"})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(AttentionSoftmaxForward))
    .SetInferShapeFn(PD_INFER_SHAPE(AttentionSoftmaxShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(AttentionSoftmaxDtype));

PD_BUILD_GRAD_OP(alignment_attention_softmax)
    .Inputs({"Y", paddle::Grad("Y")})
    .Outputs({paddle::Grad("Scores")})
    .Attrs({"threads: int"})
    .SetKernelFn(PD_KERNEL(AttentionSoftmaxBackward));
