"""The layers of an MoE block besides its router: each expert (and ERNIE's shared experts) a SwiGLU, and ERNIE's
score-correction bias.

Under tensor parallelism (config.tensor_parallel_degree > 1) every rank holds a slice of every expert, split as the
dense MLP is (gate_proj and up_proj over the intermediate features, down_proj over its inputs: each rank its
intermediate / degree features), but without the MLP's collectives: an expert's forward gives this rank's partial
output, and the block sums the weighted partial outputs of all its experts over the group once
(alignment/models/moe.py), as the weighted sum over experts is linear. The slices carry fleet's `is_distributed` /
`split_axis`, so checkpoints load this rank's slice and save the gathered whole (checkpoint.py), the gradient norm
sums their squares over the group and optimizer states reshard, as for the dense layers.
"""
from __future__ import annotations

from typing import Optional

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from alignment.parallel import tensor_parallel as tp


class SwiGLU(nn.Layer):
    """silu(x W_gate) * (x W_up) W_down with transformers' names; degree > 1: this rank's slice (a partial output)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, degree: int = 1):
        super().__init__()
        self.gate_proj = tp.sliced_linear(hidden, intermediate, bias, 1, degree)
        self.up_proj = tp.sliced_linear(hidden, intermediate, bias, 1, degree)
        self.down_proj = tp.sliced_linear(intermediate, hidden, bias, 0, degree)

    def forward(self, x):
        """x [n, hidden] -> [n, hidden]: the output, or under tensor parallelism this rank's part of it (no bias)."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # [n, intermediate / degree] inside

    def deferred_bias(self) -> Optional[paddle.Tensor]:
        """The down projection's bias [hidden] when the output is partial (added once, after the group's sum)."""
        return getattr(self.down_proj, "deferred_bias", None)


class ScoreCorrection(nn.Layer):
    """ERNIE's `moe_statics.e_score_correction_bias` [1, experts]: set by its training, not by gradients."""

    def __init__(self, experts: int):
        super().__init__()
        self.e_score_correction_bias = self.create_parameter(
            [1, experts], default_initializer=nn.initializer.Constant(0.0))
        self.e_score_correction_bias.stop_gradient = True
