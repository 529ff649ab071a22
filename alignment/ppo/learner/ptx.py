"""PPO-ptx (InstructGPT): a language-model loss on supervised data added to the policy loss, as a strategy the
trainer calls whether or not the run has ptx data (`ptx_datasets`)."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from alignment.models.logprobs import answer_token_loss
from alignment.parallel.distributed import shard
from alignment.training.batches import epoch_batches, skip_batches, to_tensors


class NoPtx:
    """No ptx data: nothing added."""
    drawn = 0  # batches taken from the stream (a checkpoint keeps it; resume skips them)

    def start(self, drawn: int, world: int, args) -> None:
        pass

    def loss(self, actor, precision, scale: float) -> Tuple[Optional[object], Dict[str, float]]:
        return None, {}


class PtxTerm(NoPtx):
    """ptx_coeff x the answer-token loss of the next batch of its own stream (seeded apart from the prompts')."""

    def __init__(self, dataset, collate, coeff: float):
        self.dataset, self.collate, self.coeff = dataset, collate, coeff

    def start(self, drawn: int, world: int, args) -> None:
        """The stream, with the `drawn` batches a resumed run already trained on skipped."""
        self.batches = epoch_batches(len(self.dataset), args.per_device_train_batch_size * world, args.seed + 1,
                                     min_size=world)
        skip_batches(self.batches, drawn)
        self.drawn = drawn

    def loss(self, actor, precision, scale: float):
        """(ptx_coeff x scale x the loss of the next batch, {"ptx_loss": scale x the loss}); counts the batch."""
        self.drawn += 1
        batch = to_tensors(self.collate([self.dataset[int(i)] for i in shard(next(self.batches))]))
        with precision.autocast():
            loss, _ = answer_token_loss(actor, batch["input_ids"], batch["attention_mask"], batch["labels"])
        return self.coeff * scale * loss, {"ptx_loss": scale * float(loss)}


def ptx_term(data, coeff: float) -> NoPtx:
    return NoPtx() if data.ptx is None else PtxTerm(data.ptx, data.collate_ptx, coeff)
