"""The layers of a pipeline model's stages (alignment/wrappers/pipeline.py builds them into fleet's PipelineLayer).

    between stages: (hidden [b, s, h], attention_mask [b, s]) and, under MoE routing replay, the rollout's
    recorded experts [b, s, sparse layers, k] (int64, -1: the token's own choice), which each sparse decoder layer
    reads its column of (alignment/ppo/learner/routing_replay.py).
"""
from __future__ import annotations

import contextlib

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.distributed.fleet.utils import recompute

from alignment.models.llama import DecoderLayer, RMSNorm, attention_bias, positions_from_mask
from alignment.models.moe import MoeBlock
from alignment.models.rope import rotary_tables
from alignment.parallel import tensor_parallel as tp


class EmbeddingStage(nn.Layer):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = tp.embedding(config.vocab_size, config.hidden_size, config.tensor_parallel_degree)

    def forward(self, args):
        input_ids, attention_mask, *replay = args
        return self.embed_tokens(input_ids), attention_mask, *replay


class DecoderStage(DecoderLayer):
    """One decoder layer; RoPE tables and the causal bias are rebuilt from the mask on every stage. With
    config.recompute its activations are recomputed in the backward pass (under the same replayed routing)."""

    def __init__(self, config, index: int):
        super().__init__(config, index)  # the index picks the family's sparse (MoE) layers
        self.config = config
        moe = config.moe
        self.sparse_index = moe.sparse_layers.index(index) if isinstance(self.mlp, MoeBlock) else None

    def forward(self, args):
        x, attention_mask, *replay = args
        attn = self.self_attn
        rope = rotary_tables(positions_from_mask(attention_mask), self.config.head_dim, self.config.rope,
                             x.dtype, attn.num_heads, attn.num_kv_heads)
        bias = attention_bias(attention_mask, x.shape[1], x.dtype, attn.num_heads)

        def layer(h):
            with self.replayed(replay[0] if replay else None):
                return DecoderLayer.forward(self, h, rope, bias)[0]

        if self.config.recompute and self.training:  # as LlamaModel: keep only the layer's input for backward
            return recompute(layer, x, use_reentrant=False), attention_mask, *replay
        return layer(x), attention_mask, *replay

    def replayed(self, experts):
        """The context this layer's expert block routes in: the recorded experts [b, s, sparse layers, k] of its
        column, or its own choice (no record, or a dense layer)."""
        if experts is None or self.sparse_index is None:
            return contextlib.nullcontext()
        return self.mlp.replaying(experts[:, :, self.sparse_index].reshape([-1, experts.shape[-1]]))


class CausalHeadStage(nn.Layer):
    """Final norm + LM head: logits [b, s, vocab] (this rank's vocabulary slice under tensor parallelism)."""

    def __init__(self, config):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = tp.column_linear(config.hidden_size, config.vocab_size, False, config.tensor_parallel_degree)

    def forward(self, args):
        return self.lm_head(self.norm(args[0])).astype("float32")


class TiedEmbedding(nn.Layer):
    """A token embedding whose table the last stage reuses as the LM head (tie_word_embeddings). Both stages hold
    a copy; fleet's SharedLayerDesc broadcasts it at start and sums its gradients over the two after each backward."""

    def __init__(self, config):
        super().__init__()
        self.weight = self.create_parameter([config.vocab_size, config.hidden_size])

    def forward(self, args):
        input_ids, attention_mask, *replay = args
        return F.embedding(input_ids, self.weight), attention_mask, *replay

    def logits(self, hidden):
        return paddle.matmul(hidden, self.weight, transpose_y=True)  # [b, s, vocab]


class VocabSplitTiedEmbedding(nn.Layer):
    """TiedEmbedding under tensor parallelism: each rank's table is its vocabulary slice [V/n, h] (fleet's
    VocabParallelEmbedding, as EmbeddingStage's), and the head's logits are that slice's [b, s, V/n], as the
    column-parallel head's are. SharedLayerDesc pairs each rank with the same tensor-parallel rank of the other
    stage, so the slices it syncs are the same slice."""

    def __init__(self, config):
        super().__init__()
        self.table = tp.embedding(config.vocab_size, config.hidden_size, config.tensor_parallel_degree)

    @property
    def weight(self):  # SharedLayerDesc's shared_weight_attr
        return self.table.weight

    def forward(self, args):
        input_ids, attention_mask, *replay = args
        return self.table(input_ids), attention_mask, *replay

    def logits(self, hidden):
        return tp.vocab_logits(hidden, self.weight)  # [b, s, V/n]; the hidden state's gradient summed over ranks


def tied_lm_head(embedding, hidden):
    """The last stage's use of the shared table: normed hidden [b, s, h] -> logits [b, s, vocab (this rank's
    slice under tensor parallelism)]."""
    return embedding.logits(hidden).astype("float32")


class NormStage(nn.Layer):
    def __init__(self, config):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, args):
        return self.norm(args[0])


class ScoreHeadStage(nn.Layer):
    """Final norm + score head: per-token scores [b, s]."""

    def __init__(self, config):
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias_attr=False)

    def forward(self, args):
        return self.score(self.norm(args[0])).astype("float32").squeeze(-1)
