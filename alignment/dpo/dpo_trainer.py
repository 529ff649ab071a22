"""Offline preference optimisation: the shared training loop with a DPO-family or KTO loss.

A batch's policy log-probs come from one forward over its rows; the reference log-probs from the frozen
reference model, from a cache filled before training (precompute_ref_log_probs), or 0 (reference-free).
"""
from __future__ import annotations

from typing import Dict, Optional

import paddle
import paddle.nn.functional as F
from tqdm import tqdm

from alignment.config.dpo import DPOArguments
from alignment.dpo.losses import preference_loss
from alignment.models.logprobs import response_log_probs_from_logits
from alignment.models.lora import adapters_disabled
from alignment.training.batches import to_tensors
from alignment.training.dataset_trainer import DatasetTrainer
from alignment.training.logger import hide_progress
from alignment.wrappers.pipeline import is_last_stage


def sequence_log_probs(model, input_ids, attention_mask, response_mask):
    """Summed log-probs of the response tokens and their counts, both [b].

    input_ids, attention_mask, response_mask: [b, s]; response_mask is 1 on answer tokens (any padding side).
    The LM head runs only on the positions that predict a response token.
    """
    hidden, _ = model.model(input_ids, attention_mask=attention_mask)  # [b, s, h]
    b, s = input_ids.shape
    predicted = response_mask[:, 1:].reshape([-1])  # [b * (s-1)]: token t+1 is predicted at position t
    counts = response_mask[:, 1:].astype("float32").sum(axis=1)  # [b]
    keep = paddle.nonzero(predicted > 0).squeeze(-1)  # [n]
    if keep.shape[0] == 0:
        return paddle.zeros([b], dtype="float32") + hidden.sum() * 0, counts  # * 0 keeps backward() valid
    states = paddle.gather(hidden[:, :-1].reshape([-1, hidden.shape[-1]]), keep)  # [n, h]
    targets = paddle.gather(input_ids[:, 1:].reshape([-1]), keep)  # [n]
    token_logps = model.token_log_probs(states, targets)[0].unsqueeze(-1)  # [n, 1]
    rows = F.one_hot(keep // (s - 1), b).astype(token_logps.dtype)  # [n, b]
    return paddle.matmul(rows, token_logps, transpose_x=True).squeeze(-1), counts  # [b], [b]


class DPOTrainer(DatasetTrainer):
    evaluate_at_start = True  # implicit-reward accuracy and margin before -> after

    def __init__(self, dpo_args: DPOArguments, args, model, reference, *rest, **kwargs):
        super().__init__(args, model, *rest, **kwargs)
        self.dpo, self.reference = dpo_args, reference

    # --- reference log-probs ------------------------------------------------------------------------------------
    @paddle.no_grad()
    def _reference_logps(self, input_ids, attention_mask, response_mask):
        if self.reference is None:  # reference-free (or simpo, which never reads them)
            return paddle.zeros([input_ids.shape[0]], dtype="float32")
        # with LoRA the reference may be the policy itself: its base weights, adapters off
        with adapters_disabled(self.reference):
            return sequence_log_probs(self.reference, input_ids, attention_mask, response_mask)[0]

    @paddle.no_grad()
    def precompute_reference(self, dataset, batch_size: int) -> None:
        """Cache each item's reference log-probs (chosen, rejected) or (row, mismatched row) in the item."""
        for start in tqdm(range(0, len(dataset), batch_size), desc="reference log-probs", dynamic_ncols=True,
                          disable=hide_progress(self.args)):
            items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
            batch = to_tensors(self.collate_fn(items))
            first = self._reference_logps(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
            if not self.dpo.loss.paired:
                second = self._reference_logps(batch["kl_input_ids"], batch["kl_attention_mask"],
                                               batch["kl_response_mask"])
            else:
                first, second = first[: len(items)], first[len(items):]
            for item, a, b in zip(items, first.numpy().tolist(), second.numpy().tolist()):
                item["ref_logps"] = (a, b)

    # --- the loss -------------------------------------------------------------------------------------------------
    def compute_loss(self, batch):
        if not self.dpo.loss.paired:
            return self._unpaired_loss(batch)
        logps, counts = sequence_log_probs(self.model, batch["input_ids"], batch["attention_mask"],
                                           batch["response_mask"])  # [2b]
        return self.pair_loss(logps, counts, self.reference_of(batch))

    def reference_of(self, batch):
        """The batch's reference log-probs [2b]: cached in the items, or from the reference model."""
        if "ref_logps" in batch:
            return batch["ref_logps"]
        return self._reference_logps(batch["input_ids"], batch["attention_mask"], batch["response_mask"])

    def pair_loss(self, logps, counts, ref):
        """Summed response log-probs, their counts and the reference's, [2b] each (chosen rows, then rejected)."""
        dpo = self.dpo
        b = logps.shape[0] // 2
        losses, chosen_rewards, rejected_rewards = preference_loss(
            logps[:b], logps[b:], ref[:b], ref[b:], counts[:b], counts[b:], dpo.loss_type, dpo.beta,
            dpo.label_smoothing, dpo.simpo_gamma, dpo.dpop_lambda)  # [b] each
        loss = losses.mean() + self._nll(logps[:b], counts[:b])
        margins = chosen_rewards - rejected_rewards
        metrics = {"rewards/chosen": float(chosen_rewards.mean()), "rewards/rejected": float(rejected_rewards.mean()),
                   "rewards/margin": float(margins.mean()),
                   "rewards/accuracy": float((margins > 0).astype("float32").mean()),
                   "logps/chosen": float(logps[:b].mean()), "logps/rejected": float(logps[b:].mean())}
        return loss, metrics, float(b)

    def batch_weight(self, batch) -> float:  # KTO: a mean over rows; the pair losses: over pairs
        rows = batch["input_ids"].shape[0]
        return float(rows // 2 if self.dpo.loss.paired else rows)

    # pipeline parallelism: the last stage has the whole-sequence logits; the reference stays a whole model
    def pipeline_labels(self, batch):
        ref = self.reference_of(batch) if is_last_stage() else paddle.zeros([batch["input_ids"].shape[0]])
        return batch["input_ids"], batch["response_mask"], ref.astype("float32").unsqueeze(-1)

    def pipeline_loss(self, logits, labels):
        input_ids, response_mask, ref = labels
        logps, counts = response_log_probs_from_logits(logits, input_ids, response_mask)  # [2b]
        return self.pair_loss(logps, counts, ref.squeeze(-1))

    def _unpaired_loss(self, batch):
        dpo = self.dpo
        logps, counts = sequence_log_probs(self.model, batch["input_ids"], batch["attention_mask"],
                                           batch["response_mask"])  # [b]
        with paddle.no_grad():
            kl_logps, _ = sequence_log_probs(self.model, batch["kl_input_ids"], batch["kl_attention_mask"],
                                             batch["kl_response_mask"])  # [b]
        if "ref_logps" in batch:
            ref, kl_ref = batch["ref_logps"], batch["kl_ref_logps"]
        else:
            ref = self._reference_logps(batch["input_ids"], batch["attention_mask"], batch["response_mask"])
            kl_ref = self._reference_logps(batch["kl_input_ids"], batch["kl_attention_mask"],
                                           batch["kl_response_mask"])
        desirable = batch["desirable"]  # [b] bool
        loss = dpo.loss()  # an unpaired loss (kto)
        kl = loss.reference_point(kl_logps, kl_ref)
        losses, chosen_rewards, rejected_rewards = loss(logps, ref, desirable, kl, dpo.beta, dpo.desirable_weight,
                                                        dpo.undesirable_weight)
        want = desirable.astype("float32")
        loss = losses.mean() + self._nll(logps * want, counts * want)
        n_good, n_bad = float(want.sum()), float((1 - want).sum())
        chosen = float(chosen_rewards.sum()) / max(n_good, 1.0)
        rejected = float(rejected_rewards.sum()) / max(n_bad, 1.0)
        metrics = {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/margin": chosen - rejected,
                   "logps/chosen": float((logps * want).sum()) / max(n_good, 1.0),
                   "logps/rejected": float((logps * (1 - want)).sum()) / max(n_bad, 1.0), "kl": float(kl)}
        return loss, metrics, float(logps.shape[0])

    def _nll(self, chosen_logps, chosen_counts):
        """nll_loss_coef * mean negative log-likelihood per chosen response token (0 when the coefficient is 0)."""
        if self.dpo.nll_loss_coef == 0:
            return paddle.zeros([], dtype="float32")
        return self.dpo.nll_loss_coef * -chosen_logps.sum() / paddle.clip(chosen_counts.sum(), min=1.0)


def summarize(before: Dict[str, float], after: Dict[str, float], keys=("eval/rewards/accuracy", "eval/rewards/margin",
                                                                       "eval/loss")) -> Optional[str]:
    lines = [f"  {k}: {before[k]:.4f} before -> {after[k]:.4f} after" for k in keys if k in before and k in after]
    return "\n".join(lines) if lines else None

