"""bf16 / fp16 mixed precision, written as Paddle's AMP documentation prescribes (paddle.amp.auto_cast around
forward passes, paddle.amp.decorate for O2 with float32 master weights, a dynamic GradScaler for fp16 whose
gradients are averaged over data ranks, unscaled, checked and clipped, in that order).

    bf16 / fp16            compute dtype (PaddleNLP's keys); neither: float32
    fp16_opt_level         O1: white-listed ops (matmuls) in the low dtype, the rest float32
                           O2: the weights themselves in the low dtype, float32 master weights in the optimizer
    amp_master_grad        O2: keep float32 gradients as well
    amp_custom_white_list / amp_custom_black_list   ops forced into / out of the low dtype
    scale_loss             fp16: the initial loss scale of the dynamic GradScaler

Paddle's CPU build has no bf16/fp16 matmul kernels: there auto_cast and decorate leave everything in float32, and
Paddle disables the GradScaler (it only acts on CUDA / XPU / custom devices), and the run says so once. The same
calls run, so the path is exercised on CPU (tests/training/test_precision.py); the low dtype and the loss scaling act on
a GPU only. The GradScaler's state is part of step checkpoints.
"""
from __future__ import annotations

import contextlib

import numpy as np
import paddle

from alignment.parallel.distributed import hybrid_group


class Precision:
    def __init__(self, args):
        self.dtype = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
        self.level = args.fp16_opt_level
        self.master_grad = args.amp_master_grad
        self.white, self.black = set(args.amp_custom_white_list), set(args.amp_custom_black_list)
        # fp16 needs loss scaling (its exponent range is bf16's minus 3 bits); bf16 does not
        self.scaler = paddle.amp.GradScaler(init_loss_scaling=args.scale_loss) if args.fp16 else None
        if self.scaler is not None and hybrid_group() is not None:
            from paddle.distributed import fleet

            # tensor / pipeline ranks hold different gradients: fleet's scaler agrees on an overflow over all ranks
            self.scaler = fleet.distributed_scaler(self.scaler)
        self.on_device = paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu()
        self.before_backward = []  # callables run before every backward pass (training/sharding.py: stage 2)

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def notice(self) -> str:
        """One line for the log when the requested precision cannot be used here ('' otherwise)."""
        if self.enabled and not self.on_device:
            return (f"{'bf16' if self.dtype == 'bfloat16' else 'fp16'} {self.level}: Paddle's CPU build has no "
                    f"{self.dtype} matmul kernels, so this run computes in float32 (the mixed-precision code path "
                    f"runs unchanged)")
        return ""

    def decorate(self, model, optimizer):
        """O2: the model's weights in the low dtype, float32 master weights in the optimizer (before any
        distributed wrapper, as Paddle requires)."""
        if self.enabled and self.level == "O2":
            model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2", dtype=self.dtype,
                                                   master_weight=True, master_grad=self.master_grad)
        return model, optimizer

    def autocast(self):
        if not self.enabled:
            return contextlib.nullcontext()
        return paddle.amp.auto_cast(enable=True, custom_white_list=self.white or None,
                                    custom_black_list=self.black or None, level=self.level, dtype=self.dtype)

    def backward(self, loss) -> None:
        for prepare in self.before_backward:
            prepare()
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer) -> None:
        """fp16: divide the gradients by the loss scale (after they are averaged over the data ranks, so every
        rank sees the same overflow; before they are checked and clipped)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> None:
        if self.scaler is not None:
            self.scaler.step(optimizer)
        else:
            optimizer.step()

    def update(self) -> None:
        """fp16: adjust the loss scale once per optimizer step (down after overflows, up after a good run)."""
        if self.scaler is not None:
            self.scaler.update()

    @property
    def loss_scale(self) -> float:
        """fp16's current loss scale (1.0 where Paddle leaves the GradScaler disabled: off-GPU, and without fp16)."""
        state = self.scaler.state_dict() if self.scaler is not None else {}
        return float(state["scale"][0]) if state else 1.0

    def state_dict(self) -> dict:
        """The GradScaler's state as JSON data (trainer_state.json), so a resumed fp16 run keeps its loss scale."""
        state = self.scaler.state_dict() if self.scaler is not None else {}
        return {**state, "scale": [float(v) for v in state["scale"]]} if state else {}

    def load_state_dict(self, state: dict) -> None:
        if state and self.scaler is not None:
            self.scaler.load_state_dict({**state, "scale": np.array(state["scale"], dtype="float32")})
