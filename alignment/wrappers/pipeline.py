"""Pipeline-parallel variants of the trained models (causal LM and score model) on fleet's PipelineLayer.

    stage layers:  0 = embedding, 1..L = decoder layers, L+1 = final norm + head (LM head or score head)
    between stages: (hidden [b, s, h], attention_mask [b, s])

fleet splits the decoder layers evenly over the stages (the embedding joins the first, the head the last), and runs
a list of micro-batches 1F1B (`pipeline_step`) or forward only (`pipeline_forward`); the loss function a trainer
gives (PPO's: alignment/ppo/learner/pipeline_update.py; SFT/RM/DPO set `LastStage.fn`) runs on the last stage. PPO's
generation and scoring do not go through the pipeline: they use a whole copy of each model
(alignment/wrappers/reshard.py), refreshed from the stages once per step.
Checkpoints are whole HF-layout directories: a stage's parameter `3.self_attn.q_proj.weight` is
`model.layers.2.self_attn.q_proj.weight` there (see `hf_name`).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_parallel import LayerDesc, PipelineLayer, SharedLayerDesc

from alignment.fileio import atomic_directory
from alignment.models import checkpoint as ckpt
from alignment.models.config import check_tensor_split
from alignment.models.llama import init_weights
from alignment.models.moe import whole_experts
from alignment.models.normalizer import load_normalizer, make_normalizer
from alignment.models.tokenizer import copy_tokenizer_files
from alignment.parallel import tensor_parallel as tp
from alignment.parallel.distributed import is_main_process
from alignment.wrappers.pipeline_stages import (CausalHeadStage, DecoderStage, EmbeddingStage, NormStage,
                                                ScoreHeadStage, TiedEmbedding, VocabSplitTiedEmbedding, tied_lm_head)


def hf_name(name: str, num_layers: int) -> str:
    """Stage parameter name -> HF checkpoint name ('0.embed_tokens.weight' -> 'model.embed_tokens.weight')."""
    if name.startswith("shared_layers.embed."):  # the tied embedding, on the first and the last stage
        return "model.embed_tokens.weight"
    index, rest = name.split(".", 1)
    index = int(index)
    if index == 0 or rest.startswith("norm."):
        return f"model.{rest}"
    if index <= num_layers:
        return f"model.layers.{index - 1}.{rest}"
    return rest  # lm_head.weight / score.weight


def is_linear_weight(name: str, tensor) -> bool:
    """Linear weights are stored transposed in HF checkpoints; in these models every 2-D `weight` but the
    embedding table is one (whatever stage holds it; not ERNIE's [1, experts] e_score_correction_bias)."""
    return tensor.ndim == 2 and name.endswith(".weight") and "embed_tokens" not in name


class PipelineModel:
    """What the trainer and checkpoints need from a pipeline model: config, whole-checkpoint load and save.
    Mixed into fleet's PipelineLayer (see build_pipeline_model)."""

    config = None
    head_type = None

    def hf_names(self) -> Dict[str, paddle.Tensor]:
        return {hf_name(n, self.config.num_hidden_layers): p for n, p in self.named_parameters()}

    def load_checkpoint(self, path: str) -> None:
        """This stage's parameters (this rank's slices) from a whole HF checkpoint."""
        loaded = ckpt.load_hf_state_dict(path)
        for name, param in self.hf_names().items():
            if name not in loaded and self.head_type == "score" and name.startswith("score."):
                continue  # a critic started from a causal LM: the score head keeps its initialisation
            if name not in loaded:
                raise ValueError(f"{path}: checkpoint has no tensor {name}")
            tensor, file = loaded[name]
            tensor = tensor.T if is_linear_weight(name, tensor) else tensor
            if list(tensor.shape) != tp.whole_shape(param):
                raise ValueError(f"{file}: tensor {name} has shape {list(loaded[name][0].shape)}, the model config "
                                 f"expects {tp.whole_shape(param)}")
            param.set_value((tp.local_slice(tensor, param) if tp.is_split(param) else tensor).astype(param.dtype))
        self.load_extra_files(path)

    def whole_state(self) -> Dict[str, paddle.Tensor]:
        """Every parameter of the whole model under HF names and Paddle orientation, on every rank (collectives:
        tensor-parallel slices are gathered, then each stage broadcasts its layers to the other stages)."""
        hcg = fleet.get_hybrid_communicate_group()
        group = hcg.get_pipe_parallel_group()
        own = {name: (tp.full_tensor(p) if tp.is_split(p) else p.detach()) for name, p in self.hf_names().items()
               if not getattr(p, "expert_parallel", False)}  # whole_experts gathers every rank's experts
        own.update({hf_name(name, self.config.num_hidden_layers): tensor  # expert parallelism: the group's experts
                    for name, tensor in whole_experts(self).items()})
        if getattr(self, "_stage_shapes", None) is None:  # which stage holds what: exchanged once
            self._stage_shapes = []
            shapes = {name: (list(t.shape), str(t.dtype).replace("paddle.", "")) for name, t in own.items()}
            dist.all_gather_object(self._stage_shapes, shapes, group=group)
        whole = {}
        for stage, shapes in enumerate(self._stage_shapes):
            for name, (shape, dtype) in shapes.items():
                tensor = own[name].clone() if stage == hcg.get_stage_id() else paddle.empty(shape, dtype=dtype)
                dist.broadcast(tensor, src=hcg.get_rank_from_stage(stage), group=group)
                whole[name] = tensor
        return whole

    def save_pretrained(self, path: str, tokenizer_dir: Optional[str] = None) -> None:
        """Every rank calls it; rank 0 writes the whole model in HF layout."""
        state = self.whole_state()
        if self.head_type == "score":  # only the last stage saw scores: its normaliser is the one to keep
            hcg = fleet.get_hybrid_communicate_group()
            holder = [self.normalizer.state_dict()]
            dist.broadcast_object_list(holder, src=hcg.get_rank_from_stage(hcg.get_pipe_parallel_world_size() - 1),
                                       group=hcg.get_pipe_parallel_group())
            self.normalizer.load_state_dict(holder[0])
        if not is_main_process():
            return
        with atomic_directory(path) as tmp:
            self.config.save_pretrained(tmp)
            ckpt.save_weights(None, tmp, state={k: (v.T if is_linear_weight(k, v) else v).contiguous()
                                                for k, v in state.items()})
            self.save_extra_files(tmp)
            if tokenizer_dir:
                copy_tokenizer_files(tokenizer_dir, tmp)

    def save_extra_files(self, path: str) -> None:
        if self.head_type == "score":
            self.normalizer.save(path)

    def load_extra_files(self, path: str) -> None:
        if self.head_type == "score":
            self.normalizer = load_normalizer(path, self.config.normalizer_type, self.config.normalizer_momentum)


class PipelineStages(PipelineModel, PipelineLayer):
    """fleet's PipelineLayer with this project's config, checkpoint and normaliser handling."""


class LastStage:
    """A pipeline model's loss function when the trainer decides per run what the last stage computes: `fn(outputs,
    labels) -> scalar tensor` (a loss for pipeline_step, anything recorded for pipeline_forward)."""

    def __init__(self):
        self.fn: Optional[Callable] = None
        self.stats: Dict[str, float] = {}

    def __call__(self, outputs, labels):
        return self.fn(outputs, labels)


def is_last_stage() -> bool:
    hcg = fleet.get_hybrid_communicate_group()
    return hcg.get_stage_id() == hcg.get_pipe_parallel_world_size() - 1


def load_pipeline_model(config_class, path: str, head: str, num_stages: int, loss_fn=None, **config_overrides):
    """build_pipeline_model for the checkpoint at `path`, split over this run's tensor-parallel degree (and an MoE
    model's experts over its expert-parallel degree)."""
    from alignment.parallel.distributed import expert_parallel_degree, model_parallel_degree

    config = config_class.from_pretrained(path)
    for key, value in config_overrides.items():
        setattr(config, key, value)
    config.tensor_parallel_degree = model_parallel_degree()
    config.expert_parallel_degree = expert_parallel_degree()
    return build_pipeline_model(config, path, head, num_stages, loss_fn if loss_fn is not None else LastStage())


def build_pipeline_model(config, path: str, head: str, num_stages: int, loss_fn):
    """A PipelineLayer holding this rank's stage of the model at `path` (head 'causal' or 'score')."""
    tied = config.tie_word_embeddings and head == "causal"
    check_tensor_split(config.tensor_parallel_degree, config, f"{path}/config.json")
    if config.moe is not None and config.moe.output_router_logits:  # the stages' losses have no auxiliary term
        raise ValueError(f"{path}/config.json: key 'output_router_logits' true (the load-balancing loss) is not "
                         "supported under pipeline parallelism yet; set it false or train without pipeline stages")
    if config.num_hidden_layers < num_stages:
        raise ValueError(f"{path}: {config.num_hidden_layers} layers cannot fill {num_stages} pipeline stages")

    decoders = [LayerDesc(DecoderStage, config, index) for index in range(config.num_hidden_layers)]
    if tied:
        table = TiedEmbedding if config.tensor_parallel_degree == 1 else VocabSplitTiedEmbedding
        layers = [SharedLayerDesc("embed", table, None, "weight", config), *decoders,
                  LayerDesc(NormStage, config), SharedLayerDesc("embed", table, tied_lm_head, "weight", config)]
    else:
        layers = [LayerDesc(EmbeddingStage, config), *decoders,
                  LayerDesc(CausalHeadStage if head == "causal" else ScoreHeadStage, config)]
    # the hybrid group's topology, so this rank's stage is the one its pipeline group says (without it fleet builds
    # a data x pipe topology that ignores tensor parallelism: under tp2 x pp2 ranks would hold the wrong stage)
    topology = fleet.get_hybrid_communicate_group().topology()
    model = PipelineStages(layers=layers, num_stages=num_stages, topology=topology, loss_fn=loss_fn,
                           seg_method="layer:DecoderStage")
    if tied and fleet.get_hybrid_communicate_group().get_stage_id() > 0:
        for param in model.shared_layers["embed"].parameters():
            param.tied_copy = True  # the first stage's copy is the one counted in the gradient norm
    model.config, model.head_type, model.name_or_path = config, head, path
    if head == "score":
        model.normalizer = make_normalizer(config.normalizer_type, config.normalizer_momentum)
    init_weights(model, config.initializer_range)
    model.load_checkpoint(path)
    return model


def micro_batch_lists(micro_batches: Sequence[Sequence[paddle.Tensor]]) -> tuple:
    """[(x, y, ...) per micro-batch] -> ([x per micro-batch], [y ...], ...): fleet takes micro-batch i of each
    list as it is, so micro-batches may differ in length (and rows)."""
    return tuple(list(column) for column in zip(*micro_batches))


def from_last_stage(wrapped, value):
    """The last stage's `value` on every stage of this rank's pipeline group."""
    holder = [value]
    hcg = wrapped._hcg
    dist.broadcast_object_list(holder, src=hcg.get_rank_from_stage(wrapped.num_stages - 1),
                               group=hcg.get_pipe_parallel_group())
    return holder[0]


def pipeline_step(wrapped, inputs, labels, loss_fn, micro_batches: int, scaler=None) -> Dict[str, float]:
    """One 1F1B forward/backward over the micro-batches of (inputs, labels) (tensors fleet slices by rows, or
    micro_batch_lists); `scaler`: fp16's GradScaler, which scales the losses. Returns the loss function's statistics
    averaged over the micro-batches, broadcast from the last stage to every stage."""
    loss_fn.stats = {}
    wrapped.forward_backward_pipeline([inputs, labels], scaler=scaler)
    return from_last_stage(wrapped, {k: v / micro_batches for k, v in loss_fn.stats.items()})


@paddle.no_grad()
def pipeline_forward(wrapped, micro_batches: List[tuple], record: Callable) -> list:
    """Forward only over [(inputs, labels)] micro-batches: record(outputs, labels) runs on the last stage for each
    and returns a picklable value; returns those values in order, on every stage. fleet runs accumulate_steps
    micro-batches at a time: a short last group is filled with repeats whose records are dropped."""
    loss_fn, per_run = wrapped._layers._loss_fn[0], wrapped.accumulate_steps
    records: list = []

    def run(outputs, labels):
        records.append(record(outputs, labels))
        return paddle.zeros([], dtype="float32")

    loss_fn.fn = run
    for start in range(0, len(micro_batches), per_run):
        group = list(micro_batches[start: start + per_run])
        group += [group[-1]] * (per_run - len(group))
        inputs, labels = zip(*group)
        wrapped.eval_batch([micro_batch_lists(inputs), micro_batch_lists(labels)], compute_loss=True)
    return from_last_stage(wrapped, records[: len(micro_batches)])
