// RoPE on q or k in a training or scoring pass, with the move to head-major that attention needs, as a Paddle
// custom operator (see cpu_kernels.cc):
//   rope: out[b, h, s, :] = x[b, s, h, :] cos + rotate_half(x[b, s, h, :]) sin, x, cos and sin [b, s, h, d]
//         (rope.py's tables, expanded over the heads); backward dx = g cos + rotate_half^T(g sin)
// Paddle's composition (rope.py apply_rope, then a transpose) rounds each product once and the sum once, its matmul
// by the signed permutation being exact; these loops do the same without fused multiply-adds (fp-contract=off), so
// the two give the same bits forward and backward. rotate_half pairs feature i with i + d/2 (HF's layout) or 2i
// with 2i + 1 (interleaved), as rope.py's rotate_half_matrix. attention_row.h's rope_head, the decode kernels' RoPE,
// is left free to fuse (they round differently from the model's layers anyway); sharing it would change their bits.
#include "common.h"

namespace {

using alignment_kernels::check_cpu_f32;
using alignment_kernels::parallel_for;

// where feature i's rotated partner is, and the sign it enters with: rotate_half(x)[i] = sign(i) x[partner(i)]
inline int64_t partner(int64_t i, int64_t half, bool interleaved) {
  return interleaved ? (i ^ 1) : (i < half ? i + half : i - half);
}
inline float sign(int64_t i, int64_t half, bool interleaved) {
  return (interleaved ? (i % 2 == 0) : (i < half)) ? -1.0f : 1.0f;
}

// y = x c + rotate_half(x) s over one head of d floats
__attribute__((optimize("fp-contract=off"))) void rope_head_forward(const float* __restrict x,
                                                                     const float* __restrict c,
                                                                     const float* __restrict s, float* __restrict y,
                                                                     int64_t d, bool interleaved) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < d; ++i) {
    const float turned = (sign(i, half, interleaved) * x[partner(i, half, interleaved)]) * s[i];
    const float kept = x[i] * c[i];
    y[i] = kept + turned;
  }
}

// dx = g c + rotate_half^T(g s): x[i] entered the output only at its partner p, as sign(p) x[i] s[p]
__attribute__((optimize("fp-contract=off"))) void rope_head_backward(const float* __restrict g,
                                                                      const float* __restrict c,
                                                                      const float* __restrict s,
                                                                      float* __restrict dx, int64_t d,
                                                                      bool interleaved) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < d; ++i) {
    const int64_t p = partner(i, half, interleaved);
    const float returned = sign(p, half, interleaved) * (g[p] * s[p]);
    const float kept = g[i] * c[i];
    dx[i] = kept + returned;
  }
}

struct Dims {
  int64_t b, s, h, d;
};

Dims checked_dims(const paddle::Tensor& x, const paddle::Tensor& cos, const paddle::Tensor& sin) {
  check_cpu_f32(x, "x");
  check_cpu_f32(cos, "cos");
  check_cpu_f32(sin, "sin");
  PD_CHECK(x.shape().size() == 4, "x must be [b, s, heads, d]");
  PD_CHECK(cos.shape() == x.shape() && sin.shape() == x.shape(), "cos and sin must have x's shape");
  PD_CHECK(x.shape()[3] % 2 == 0, "RoPE needs an even head dimension");
  return {x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]};
}

// f(offset of x[b, s, h] in the [b, s, heads, d] layout, offset of out[b, h, s] in [b, heads, s, d]) for every b, s, h
template <class F>
void each_head(const Dims& n, int threads, F f) {
  parallel_for(n.b * n.s, threads, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / n.s, t = row % n.s;
      for (int64_t h = 0; h < n.h; ++h) f(row * n.h * n.d + h * n.d, ((b * n.h + h) * n.s + t) * n.d);
    }
  }, n.h * n.d);
}

std::vector<paddle::Tensor> RopeForward(const paddle::Tensor& x, const paddle::Tensor& cos,
                                        const paddle::Tensor& sin, bool interleaved, int threads) {
  const Dims n = checked_dims(x, cos, sin);
  auto out = paddle::empty({n.b, n.h, n.s, n.d}, paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float *xp = x.data<float>(), *c = cos.data<float>(), *s = sin.data<float>();
  float* o = out.data<float>();
  each_head(n, threads, [&](int64_t at, int64_t to) {
    rope_head_forward(xp + at, c + at, s + at, o + to, n.d, interleaved);
  });
  return {out};
}

std::vector<paddle::Tensor> RopeBackward(const paddle::Tensor& cos, const paddle::Tensor& sin,
                                         const paddle::Tensor& grad_out, bool interleaved, int threads) {
  check_cpu_f32(grad_out, "the gradient of the output");
  const Dims n = checked_dims(cos, cos, sin);
  PD_CHECK(grad_out.shape() == std::vector<int64_t>({n.b, n.h, n.s, n.d}), "the gradient must be [b, heads, s, d]");
  auto dx = paddle::empty(cos.shape(), paddle::DataType::FLOAT32, paddle::CPUPlace());
  const float *g = grad_out.data<float>(), *c = cos.data<float>(), *s = sin.data<float>();
  float* out = dx.data<float>();
  each_head(n, threads, [&](int64_t at, int64_t from) {
    rope_head_backward(g + from, c + at, s + at, out + at, n.d, interleaved);
  });
  return {dx};
}

std::vector<std::vector<int64_t>> RopeShape(const std::vector<int64_t>& x, const std::vector<int64_t>& cos,
                                            const std::vector<int64_t>& sin) {
  return {{x[0], x[2], x[1], x[3]}};
}

std::vector<paddle::DataType> RopeDtype(const paddle::DataType& x, const paddle::DataType& cos,
                                        const paddle::DataType& sin) {
  return {paddle::DataType::FLOAT32};
}

}  // namespace

PD_BUILD_OP(alignment_rope)
    .Inputs({"X", "Cos", "Sin"})
    .Outputs({"Out"})
    .Attrs({"interleaved: bool", "threads: int"})
    .SetKernelFn(PD_KERNEL(RopeForward))
    .SetInferShapeFn(PD_INFER_SHAPE(RopeShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RopeDtype));

PD_BUILD_GRAD_OP(alignment_rope)
    .Inputs({"Cos", "Sin", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .Attrs({"interleaved: bool", "threads: int"})
    .SetKernelFn(PD_KERNEL(RopeBackward));
