"""eval_mode 'single': generate with a whole copy of a tensor- or pipeline-parallel actor (PaddleNLP's
export_evaluate_model); under sharding stage 3 and expert parallelism too (an expert-parallel model's every
forward is a collective of its group, so ranks that decode rollouts of their own lengths decode with every expert). Under pipeline parallelism the critic's old values come from a
whole copy too.

Token-by-token decoding under tensor parallelism pays collectives at every layer of every token; a whole copy on
each rank generates with none. The copy is refreshed from the training slices (one all-gather per parameter)
once per policy version, i.e. once per PPO step.
"""
from __future__ import annotations

import dataclasses

import paddle

from alignment.models.moe import whole_experts
from alignment.models.weights_digest import set_policy_version
from alignment.parallel import sharded
from alignment.parallel import tensor_parallel as tp


class WholeCopy:
    """model: a tensor-parallel model, or a pipeline model (alignment/wrappers/pipeline.py) whose whole
    counterpart is `cls` (LlamaForCausalLM / ScoreModel)."""

    def __init__(self, model, cls=None):
        config = dataclasses.replace(model.config, tensor_parallel_degree=1, expert_parallel_degree=1)
        self.model = (cls or type(model))(config)
        for param in self.model.parameters():
            param.stop_gradient = True
        self.model.eval()
        self.version = None

    @paddle.no_grad()
    def refreshed(self, source, version):
        """The copy with `source`'s current weights (gathered when split); cheap when `version` is unchanged."""
        if version != self.version:
            own = dict(self.model.named_parameters())
            if hasattr(source, "whole_state"):  # pipeline stages exchange their layers
                for name, tensor in source.whole_state().items():
                    own[name].set_value(tensor)
            else:  # sharding stage 3: each rank's slices gathered first
                for name, param in source.named_parameters():
                    if getattr(param, "expert_parallel", False):
                        continue  # whole_experts below gathers every rank's experts
                    value = sharded.whole_value(param)
                    own[name].set_value(tp.gather_along(value, param.split_axis) if tp.is_split(param) else value)
                for name, tensor in whole_experts(source).items():  # expert parallelism: the group's experts
                    own[name].set_value(tensor)
            self.version = version
            set_policy_version(self.model, version)
        return self.model
