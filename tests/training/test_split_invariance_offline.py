"""Split invariance of the offline objectives (issue 37): SFT, the reward model (sequence- and token-wise) and
DPO / IPO / hinge / SimPO / KTO. One optimizer step of DatasetTrainer.training_step over the same 6 rows, as one
micro-batch or as gradient accumulation over 2, 3 or 6 micro-batches (rows of different lengths), gives the loss
and gradient of a float64 reference of the whole batch, within float32 rounding.

The reference takes the model outputs the loss starts from (per-sequence log-probs, end scores) from one float32
pass as float64 leaves, computes the stage's pure loss function on them in float64 (its formula has golden tests
against TRL elsewhere; here what is checked is what it is a mean over), and carries the gradient to the weights
with the model's own backward.

Not invariant by definition, and so held fixed here: KTO's reference point z0 is the detached mean log-ratio of the
micro-batch's mismatched rows (the KTO paper's and TRL's estimate, per micro-batch), so the test makes it 0 in every
micro-batch (mismatched log-ratios all < 0, clamped) and checks the rest of the KTO loss.
"""
import types

import numpy as np
import paddle
import pytest

from alignment.config.dpo import DPOArguments
from alignment.config.reward import RewardArguments
from alignment.config.training import TrainingArguments
from alignment.data.tokenized import IGNORE_INDEX, collate_preference, collate_supervised
from alignment.dpo.data import collate_pairs, collate_unpaired
from alignment.dpo.losses import kto_loss, preference_loss
from alignment.dpo.dpo_trainer import DPOTrainer, sequence_log_probs
from alignment.models import LlamaForCausalLM
from alignment.models.config import LlamaConfig
from alignment.models.score_model import ScoreConfig, ScoreModel
from alignment.rm.losses import sequence_wise_loss
from alignment.rm.reward_trainer import RewardTrainer
from alignment.sft.sft_trainer import SupervisedTrainer
from alignment.training.batches import to_tensors
from alignment.training.dataset_trainer import DatasetTrainer
from alignment.training.precision import Precision
from tests.split_invariance import CONFIG, assert_matches

ROWS, PAD = 6, 0
ACCUMULATIONS = (1, 2, 3, 6)  # micro-batches of 6, 3, 2 and 1 rows


def token_rows(rng, lengths):
    return [rng.integers(1, CONFIG["vocab_size"], n).tolist() for n in lengths]


def items_for(stage, seed=0):
    """ROWS items of the stage's dataset, prompts of 2-4 and answers of 1-7 tokens."""
    rng = np.random.default_rng(seed)
    prompts = token_rows(rng, rng.integers(2, 5, ROWS))
    answers = token_rows(rng, [1, 7, 2, 6, 3, 5])
    others = token_rows(rng, [4, 1, 6, 2, 7, 3])
    if stage == "sft":
        return [{"input_ids": p + a, "labels": [IGNORE_INDEX] * len(p) + a} for p, a in zip(prompts, answers)]
    if stage == "kto":
        return [{"prompt_ids": p, "completion_ids": a, "kl_completion_ids": o, "desirable": i % 3 != 0,
                 "ref_logps": (float(rng.normal(-20, 2)), 0.0)} for i, (p, a, o) in enumerate(zip(prompts, answers,
                                                                                                    others))]
    return [{"better_input_ids": p + a, "better_prompt_len": len(p), "worse_input_ids": p + o,
             "worse_prompt_len": len(p), "ref_logps": (float(rng.normal(-20, 2)), float(rng.normal(-20, 2)))}
            for p, a, o in zip(prompts, answers, others)]


def build(stage, loss_type=None):
    """(trainer, collate, model): the stage's trainer without its __init__ (no files, no data streams), its real
    compute_loss / batch_weight / training_step; the optimizer step replaced by reading the gradients."""
    paddle.seed(0)
    if stage == "rm":
        model, cls, collate = ScoreModel(ScoreConfig(**CONFIG)), RewardTrainer, collate_preference
    else:
        model = LlamaForCausalLM(LlamaConfig(**CONFIG))
        cls = SupervisedTrainer if stage == "sft" else DPOTrainer
        collate = {"sft": collate_supervised, "dpo": collate_pairs, "kto": collate_unpaired}[stage]
    trainer = object.__new__(cls)
    trainer.model, trainer.pipe, trainer.precision = model, None, Precision(TrainingArguments())
    trainer.reference = None
    trainer.reward_args = RewardArguments(loss_type=loss_type or "sequence-wise", regularization=0.01)
    trainer.dpo = DPOArguments(loss_type=loss_type or "sigmoid", beta=0.5)
    return trainer, (lambda items: collate(items, PAD)), model


def run_step(trainer, collate, items, accum):
    """One DatasetTrainer.training_step over `items` in `accum` micro-batches -> (loss, {parameter: gradient})."""
    size = len(items) // accum
    batches = iter([to_tensors(collate(items[s: s + size])) for s in range(0, len(items), size)])
    grads = []

    def finish_step(row, losses):
        params = trainer.model.parameters()
        grads.append({p.name: p.grad.numpy().copy() for p in params if p.grad is not None})
        for p in params:
            p.clear_gradient()
        return row

    trainer.args = types.SimpleNamespace(gradient_accumulation_steps=accum)
    trainer.next_batch, trainer.finish_step = (lambda: next(batches)), finish_step
    row = DatasetTrainer.training_step(trainer)
    return row["loss"], grads[0]


def f64_leaf(x):
    leaf = paddle.to_tensor(x.numpy().astype("float64"))
    leaf.stop_gradient = False
    return leaf


def reference(stage, trainer, batch):
    """(float64 loss of the whole batch, {parameter: gradient})."""
    model = trainer.model
    if stage == "rm":
        outputs = model(batch["input_ids"], batch["attention_mask"]).end_scores  # [2b]
    elif stage == "sft":
        mask = (batch["labels"] != IGNORE_INDEX).astype("int64")
        outputs, counts = sequence_log_probs(model, batch["input_ids"], batch["attention_mask"], mask)  # [b]
    else:
        outputs, counts = sequence_log_probs(model, batch["input_ids"], batch["attention_mask"],
                                             batch["response_mask"])  # [2b] or [b]
    x = f64_leaf(outputs)
    if stage == "rm":
        b = x.shape[0] // 2
        loss = sequence_wise_loss(x[:b], x[b:], trainer.reward_args.regularization)
    elif stage == "sft":
        loss = -x.sum() / float(counts.sum())
    elif stage == "kto":
        ref = paddle.to_tensor(batch["ref_logps"].numpy().astype("float64"))
        loss = kto_loss(x, ref, batch["desirable"], paddle.zeros([], "float64"), trainer.dpo.beta)[0].mean()
    else:
        b, ref, n = x.shape[0] // 2, f64_leaf(batch["ref_logps"]), f64_leaf(counts)
        dpo = trainer.dpo
        loss = preference_loss(x[:b], x[b:], ref[:b], ref[b:], n[:b], n[b:], dpo.loss_type, dpo.beta,
                               dpo.label_smoothing, dpo.simpo_gamma)[0].mean()
    d_x, = paddle.grad(loss, [x])
    params = [p for p in model.parameters() if not p.stop_gradient]
    grads = paddle.grad([outputs], params, [d_x.astype("float32")], allow_unused=True)
    return float(loss), None, {p.name: g.numpy() for p, g in zip(params, grads) if g is not None}


@pytest.mark.parametrize("stage,loss_type", [("sft", None), ("rm", "sequence-wise"), ("dpo", "sigmoid"),
                                             ("dpo", "ipo"), ("dpo", "hinge"), ("dpo", "simpo"), ("kto", "kto")])
def test_one_micro_batch_or_any_accumulation_count_trains_the_same(stage, loss_type):
    trainer, collate, _ = build(stage, loss_type)
    items = items_for(stage)
    want = reference(stage, trainer, to_tensors(collate(items)))
    for accum in ACCUMULATIONS:
        loss, grads = run_step(trainer, collate, items, accum)
        assert_matches((loss, None, grads), want, what=f"{stage} {loss_type}: {accum} micro-batches")


def test_token_wise_reward_loss_is_a_mean_over_pairs_whatever_the_split():
    """The token-wise RM loss (a mean over pairs of per-pair token means) in 1, 2, 3 or 6 micro-batches."""
    trainer, collate, _ = build("rm", "token-wise")
    items = items_for("rm")
    loss, grads = run_step(trainer, collate, items, 1)
    for accum in ACCUMULATIONS[1:]:
        got = run_step(trainer, collate, items, accum)
        assert_matches((*got[:1], None, got[1]), (loss, None, grads), what=f"token-wise: {accum} micro-batches")


def test_sft_is_not_the_mean_of_per_micro_batch_token_means():
    """HF Trainer before num_items_in_batch (and this trainer before issue 37) averaged each micro-batch's token
    mean: by definition split-dependent when micro-batches hold different numbers of answer tokens, as here (3
    rows of 1 + 7 + 2 answer tokens, then 3 of 6 + 3 + 5). Ours is the whole batch's; theirs is far off it."""
    trainer, collate, _ = build("sft")
    items = items_for("sft")
    whole = reference("sft", trainer, to_tensors(collate(items)))
    parts = [reference("sft", trainer, to_tensors(collate(items[s: s + 3]))) for s in (0, 3)]
    theirs = {key: (parts[0][2][key] + parts[1][2][key]) / 2 for key in whole[2]}
    loss, grads = run_step(trainer, collate, items, 2)
    assert_matches((loss, None, grads), whole)
    worst = max(float(np.abs(theirs[k] - whole[2][k]).max() / np.abs(whole[2][k]).max()) for k in whole[2])
    assert worst > 1e-2, worst  # 1000 x the tolerance of assert_matches
