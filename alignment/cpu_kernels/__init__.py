"""Our CPU kernels, and what each replaces: C++ custom operators (csrc/*.cc, built by build.py) for the
element-wise and row-reduction steps whose Paddle CPU kernels run 3-5x slower than torch's on one thread, and for
a decode step's weight GEMMs, which MKL reads from memory below the bandwidth (docs/performance.md, "Where the time
goes"). Each splits its rows or column panels over the usable cores (an OpenMP team on the runtime MKL's GEMMs use,
whatever OMP_NUM_THREADS says) with loops the compiler vectorises for this CPU.

- `token_log_probs` replaces logprobs.py's `cross_entropy_with_softmax` (log p(label)) and the entropy's pass over
  its softmax;
- `rms_norm`: llama.py `RMSNorm.forward`, fused_decode.py `rms_norm` (square, mean, rsqrt and two multiplies);
- `swiglu`: llama.py `MLP.forward`, fused_decode.py `_mlp` (`F.silu(gate) * up`);
- `attention_softmax`: llama.py `masked_softmax` (attention, fused_decode.py's steps: `F.softmax(scores + bias)`);
- `rope`: rope.py `rope_heads_first` (q's and k's RoPE in a training or scoring pass: two multiplies, a matmul by
  the rotation, an add, and the transpose to head-major), with the same bits as that composition;
- `decode_matmul`: fused_decode.py's weight GEMMs (`paddle.matmul`, MKL's sgemm), over weights packed once per
  generate call;
- `decode_attention`: fused_decode.py's decode step from q | k | v to the attention's output: RoPE (two
  multiplies, a matmul, an add), the cache writes (`put_along_axis_`), q k^T, the softmax and @ v, with their
  reshapes and split;
- `decode_layer`: fused_decode.py's decoder layer of a decode step, a dozen calls (two norms, five weight GEMMs,
  the attention, SwiGLU, two adds), in one call over the layer's weights packed into the decode GEMM's panels
  (csrc/decode_layer.cc): the loops of `decode_matmul` and `decode_attention` and the RMSNorm and SwiGLU rows, the
  same bits as those kernels called one by one. MKL's sgemm pays a thread start and a packing of the weight per
  call, which at a decode step's 8 rows over SmolLM2's small projections ([576, 576], [576, 960]) costs as much as
  reading the weight: so the layer in one call can win where the decode GEMM alone does not.

Each function returns the kernel's result, or None when it does not apply: the caller then runs its composition.
It applies to float32 CPU tensors in eager mode (never inside a static program, which exported models must run
without our library), when the library is built and the kernel is chosen. ALIGNMENT_CPU_KERNELS chooses: `auto`
(the entry points' default, alignment/cpu_env.py) takes each kernel that ran faster than its composition when this
CPU was measured (choice.py, once per CPU, kept); `on` takes all eight, `off` (the default when the variable is
unset, as for a library user) none. Gradients flow through each kernel's backward operator (the two decode
kernels take none: decoding runs without gradients). Token log-probs clip
z - max(z) at -64 before the log, as Paddle's cross-entropy kernel does (log p >= -64 - log S); the entropy is exact.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional, Tuple

import paddle

from alignment import cpu_env
from alignment.cpu_kernels import build

REPLACES: Dict[str, str] = {
    "token_log_probs": "cross_entropy_with_softmax (log p of the label) and the entropy over its softmax",
    "rms_norm": "RMSNorm: square, mean, rsqrt, multiply by the normed input and by the expanded weight",
    "swiglu": "SwiGLU: F.silu(gate) * up",
    "attention_softmax": "attention's softmax(scores + bias): an add and Paddle's softmax",
    "rope": "RoPE on q and k: two multiplies, a matmul by the rotation, an add and the transpose to head-major",
    "decode_matmul": "a decode step's weight GEMMs: paddle.matmul (MKL's sgemm) over the fused decoder's weights",
    "decode_attention": "a decode step's RoPE, cache writes and attention: a dozen Paddle calls per layer",
    "decode_layer": "a decode step's decoder layer: norms, MKL's GEMMs, attention and SwiGLU, a dozen calls",
}
MODES = ("auto", "on", "off")
_chosen: Dict[str, bool] = {}
_agreed: Dict[str, bool] = {}  # set by agree(): what every rank of a job runs


def mode() -> str:
    value = os.environ.get("ALIGNMENT_CPU_KERNELS", "off") or "off"
    if value not in MODES:
        raise ValueError(f"ALIGNMENT_CPU_KERNELS must be one of {', '.join(MODES)}, got {value!r}")
    return value


def threads() -> int:
    """The kernels' thread count: MKL's (MKL_NUM_THREADS: cpu_env's usable cores over the processes on this host,
    share_cores' count, or the user's), else the usable cores over those processes."""
    value = os.environ.get("MKL_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else cpu_env.cores_per_process()


def _library(name: str):
    """The compiled module when kernel `name` is chosen, else None."""
    if _agreed:
        return build.load_kernels() if _agreed[name] else None
    current = mode()
    if current == "off":
        return None
    module = build.load_kernels()
    if module is None or current == "on":
        return module
    if name not in _chosen:
        from alignment.cpu_kernels import choice

        _chosen.update(choice.measured_choice(module))
    return module if _chosen.get(name) else None


@paddle.jit.not_to_static
def chosen(name: str) -> bool:
    """Whether kernel `name` runs where its inputs fit (builds and measures on the first call)."""
    return _library(name) is not None


def _fits(*tensors) -> bool:
    return paddle.in_dynamic_mode() and all(t.dtype == paddle.float32 and t.place.is_cpu_place() for t in tensors)


@paddle.jit.not_to_static  # under to_static: not converted, and in_dynamic_mode() is False
def token_log_probs(logits, labels) -> Optional[Tuple[paddle.Tensor, paddle.Tensor]]:
    """(log p(label) [N], differentiable; entropy [N], no gradient) of logits [N, V] and int labels [N] (a label
    < 0 gives log p 0 and no gradient), or None."""
    if not _fits(logits) or logits.ndim != 2:
        return None
    module = _library("token_log_probs")
    if module is None:
        return None
    log_p, entropy, _ = module.alignment_token_logprobs(logits, labels.astype("int64").reshape([-1]), threads())
    entropy.stop_gradient = True
    return log_p, entropy


@paddle.jit.not_to_static
def rms_norm(x, weight, eps: float) -> Optional[paddle.Tensor]:
    """x * rsqrt(mean(x^2) + eps) * weight of x [..., H] and weight [H] -> [..., H], or None."""
    if not _fits(x, weight) or weight.ndim != 1:
        return None
    module = _library("rms_norm")
    if module is None:
        return None
    y, _ = module.alignment_rms_norm(x, weight, float(eps), threads())
    return y


@paddle.jit.not_to_static
def swiglu(gate, up) -> Optional[paddle.Tensor]:
    """silu(gate) * up, gate and up of one shape, or None."""
    if not _fits(gate, up) or gate.shape != up.shape:
        return None
    module = _library("swiglu")
    return None if module is None else module.alignment_swiglu(gate, up, threads())


def agree(all_ranks_min: Callable[[List[int]], List[int]]) -> Dict[str, bool]:
    """Make every rank of a job run the same kernels: each rank's choice (built and measured here, where it was
    not yet) goes through `all_ranks_min` (an element-wise minimum over the job's ranks), and a kernel runs only
    where every rank took it. Ranks that build or measure apart (another host, a cache they cannot write) could
    otherwise round RMSNorm's or SwiGLU's last bits differently, and tensor-parallel ranks would hold different
    copies of the residual stream they are meant to share. Called by parallel/distributed.py once the groups
    exist; returns the agreed choice."""
    mine = [int(_library(name) is not None) for name in REPLACES]
    _agreed.update({name: bool(flag) for name, flag in zip(REPLACES, all_ranks_min(mine))})
    return dict(_agreed)


@paddle.jit.not_to_static
def attention_softmax(scores, bias) -> Optional[paddle.Tensor]:
    """softmax(scores + bias) over the last axis of scores [..., T] and bias of the same shape (no gradient: a
    mask), or None."""
    if not _fits(scores, bias) or scores.shape != bias.shape or not bias.stop_gradient:
        return None  # a bias that takes a gradient (learned, not a mask): the composition gives it one
    module = _library("attention_softmax")
    return None if module is None else module.alignment_attention_softmax(scores, bias, threads())


@paddle.jit.not_to_static
def rope(x, cos, sin, interleaved: bool) -> Optional[paddle.Tensor]:
    """x cos + rotate_half(x) sin of x, cos, sin [b, s, heads, d] (cos and sin tables: no gradient), moved to
    head-major [b, heads, s, d]; or None."""
    if not _fits(x, cos, sin) or x.ndim != 4 or cos.shape != x.shape or sin.shape != x.shape:
        return None
    if not (cos.stop_gradient and sin.stop_gradient):
        return None  # tables that take a gradient: the composition gives them one
    module = _library("rope")
    return None if module is None else module.alignment_rope(x, cos, sin, bool(interleaved), threads())


@paddle.jit.not_to_static
def pack_panels(weight, transposed: bool = False, kernel: str = "decode_matmul") -> Optional[paddle.Tensor]:
    """weight [K, N] ([N, K] with transposed: an embedding as the LM head) copied into the column panels
    [ceil(N / 32), K, 32] that `panel_matmul` and `decode_layer` stream, or None where `kernel` (the one that
    will read them) does not run."""
    if not _fits(weight) or weight.ndim != 2:
        return None
    module = _library(kernel)
    if module is None:
        return None
    with paddle.no_grad():
        return module.alignment_pack_panels(weight, bool(transposed), threads())


def panel_matmul(x, panels, n: int) -> paddle.Tensor:
    """x [..., K] @ the weight that `pack_panels` packed into panels [ceil(n / 32), K, 32] -> [..., n], without a
    gradient (a decode step's: each output one multiply-add chain over K, the same bits at any batch size)."""
    return build.load_kernels().alignment_panel_matmul(x, panels, int(n), threads())


@paddle.jit.not_to_static
def decode_attention(qkv, cos, sin, k_cache, v_cache, column, bias, heads: int, interleaved: bool
                     ) -> Optional[paddle.Tensor]:
    """One decode step's attention (no gradient): qkv, cos, sin [b, heads + 2 kv_heads, d] (fused_decode.py's
    layout and rotary tables), the caches [b, kv_heads, width, d] (the row's k and v are written at its column
    [b], in place), bias [b, width] (additive, the mask) -> [b, 1, heads d]; or None."""
    if not _fits(qkv, cos, sin, k_cache, v_cache, bias):
        return None
    module = _library("decode_attention")
    if module is None:
        return None
    if column.dtype != paddle.int64 or column.ndim != 1:  # the engine's columns are int64 [b] already
        column = column.astype("int64").reshape([-1])
    return module.alignment_decode_attention(qkv, cos, sin, k_cache, v_cache, column, bias, int(heads),
                                             bool(interleaved), threads())[0]


def decode_layer(x, cos, sin, k_cache, v_cache, column, bias, input_norm, post_norm, packed: tuple, heads: int,
                 interleaved: bool, eps: float) -> paddle.Tensor:
    """One decoder layer of a decode step (no gradient): x [b, 1, hidden]; cos, sin, the caches, column and bias as
    for `decode_attention` (the caches written in place); the norm weights [hidden]; packed: the q | k | v, o,
    gate, up and down weights as `pack_panels(..., kernel="decode_layer")` packed them. -> [b, 1, hidden]. For a
    caller that has those panels (the kernel chosen)."""
    qkv, o, gate, up, down = packed
    return build.load_kernels().alignment_decode_layer(x, input_norm, qkv, cos, sin, k_cache, v_cache, column, bias, o,
                                                        post_norm, gate, up, down, int(heads), bool(interleaved),
                                                        float(eps), threads())[0]


def forget_choice() -> None:
    """Forget this process's choice and agreement (tests; the built library stays loaded: Paddle registers a
    library's operators once per process)."""
    _chosen.clear()
    _agreed.clear()
