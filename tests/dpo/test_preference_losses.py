"""The preference-loss registry (alignment/dpo/losses.py, `loss_type`): every registered loss's traits are what its
math and the stage do with it: a reference-free loss ignores the reference and loads no reference model, a
token-averaged one reads the token counts, label_smoothing is accepted where it acts, and an unpaired loss (KTO)
trains on unpaired rows while the others read pairs."""
import os
from types import SimpleNamespace

import numpy as np
import pytest

from alignment.config import ArgumentError, ArgumentParser, DPOArguments
from alignment.config.dpo import KTOArguments
from alignment.config.registry import PREFERENCE_LOSSES
from alignment.dpo import stage
from alignment.dpo.data import UnpairedDataset
from alignment.dpo.losses import PreferenceLoss, preference_loss
from tests.dpo.test_dpo import NC, NR, PC, PR, RC, RR, run, t

PAIRED = PREFERENCE_LOSSES.names(where=lambda loss: loss.paired)
BETA = {"simpo": 2.0}  # simpo's margin makes beta 0.1 flat around these ratios


def losses(loss_type, ref=(RC, RR), counts=(NC, NR), **options):
    return preference_loss(t(PC), t(PR), t(ref[0]), t(ref[1]), t(counts[0]), t(counts[1]), loss_type,
                           beta=BETA.get(loss_type, 0.1), **options)[0].numpy()


def changes(before, after) -> bool:
    return not np.allclose(before, after, rtol=1e-6, atol=1e-7)


def test_the_built_in_losses_and_their_traits():
    assert PREFERENCE_LOSSES.names() == ["sigmoid", "ipo", "hinge", "simpo", "dpop", "kto_pair", "sppo_hard",
                                         "nca_pair", "or", "kto"]
    assert PREFERENCE_LOSSES.names(where=lambda loss: not loss.paired) == ["kto"]
    assert PREFERENCE_LOSSES.names(where=lambda loss: loss.reference_free) == ["simpo", "or"]
    assert PREFERENCE_LOSSES.names(where=lambda loss: loss.token_averaged) == ["ipo", "simpo", "or"]
    assert PREFERENCE_LOSSES.names(where=lambda loss: loss.takes_label_smoothing) == ["sigmoid", "simpo"]


@pytest.mark.parametrize("loss_type", PAIRED)
def test_each_paired_losss_traits_are_what_its_math_reads(loss_type):
    loss = PREFERENCE_LOSSES[loss_type]
    base = losses(loss_type)
    assert np.isfinite(base).all()
    assert changes(base, losses(loss_type, ref=([0.5, -3.0], [-0.2, -4.0]))) == (not loss.reference_free)
    assert changes(base, losses(loss_type, counts=([4.0, 1.0], [2.0, 5.0]))) == loss.token_averaged
    assert changes(base, losses(loss_type, label_smoothing=0.2)) == loss.takes_label_smoothing


@pytest.mark.parametrize("loss_type", PREFERENCE_LOSSES.names())
def test_the_arguments_and_the_data_follow_the_traits(tiny_model_dir, loss_type):
    from alignment.models import Tokenizer

    loss = PREFERENCE_LOSSES[loss_type]
    parser = ArgumentParser(DPOArguments)
    dpo_args, = parser.parse_dict({"loss_type": loss_type}, "test")
    assert dpo_args.loss is loss and dpo_args.needs_reference == (not loss.reference_free)
    if not loss.takes_label_smoothing:
        with pytest.raises(ArgumentError, match="key 'label_smoothing' applies to loss_type sigmoid or simpo"):
            parser.parse_dict({"loss_type": loss_type, "label_smoothing": 0.1}, "test")
    if loss.paired:
        with pytest.raises(ArgumentError, match=f"run_kto.py trains KTO, not '{loss_type}'"):
            ArgumentParser(KTOArguments).parse_dict({"loss_type": loss_type}, "test")
    tokenizer = Tokenizer.from_pretrained(tiny_model_dir)
    pairs = [{"input": "Say hi.", "answer": "Hi!", "other_answer": "No.", "better": True},
             {"input": "Count to two.", "answer": "One, two.", "other_answer": "Three.", "better": False}]
    train, evaluation, collate = stage.build_datasets(dpo_args, SimpleNamespace(max_length=64), tokenizer, pairs,
                                                        None, seed=0)
    batch = collate(list(train))
    assert evaluation is None and isinstance(train, UnpairedDataset) == (not loss.paired)
    # pairs: chosen rows then rejected rows; unpaired: each side of a pair a row, with its mismatched completion
    assert batch["input_ids"].shape[0] == 4 and ("kl_input_ids" in batch) == (not loss.paired)


def test_a_reference_free_loss_trains_without_loading_a_reference_model(tmp_path, tiny_model_dir, monkeypatch):
    def no_reference(*args, **kwargs):
        raise AssertionError("a reference-free loss loaded a reference model")

    monkeypatch.setattr(stage.setup, "reference_model", no_reference)
    results = run(tmp_path, tiny_model_dir, "--loss_type", "or", "--max_steps", "2", "--logging_steps", "1")
    assert np.isfinite(results["eval/loss"]) and os.path.isdir(tmp_path / "out" / "model")


def test_a_users_loss_registers_by_its_name_and_the_arguments_accept_it():
    class Squared(PreferenceLoss):
        NAME = "test_squared"
        reference_free = True

        def __call__(self, c, r, o):
            return (c - r - 1.0) ** 2

    try:
        dpo_args, = ArgumentParser(DPOArguments).parse_dict({"loss_type": "test_squared"}, "test")
        assert dpo_args.loss is Squared and not dpo_args.needs_reference
        np.testing.assert_allclose(losses("test_squared"), [(-1.0 + 3.0 - 1.0) ** 2, (-2.0 + 1.5 - 1.0) ** 2])
    finally:
        del PREFERENCE_LOSSES.classes["test_squared"]
