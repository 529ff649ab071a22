"""Mixed precision (training/precision.py) on Paddle's CPU build: bf16 and fp16 (O1 and O2) run the AMP code path
- auto_cast, decorate, the GradScaler's scale / unscale / step / update calls - which on CPU computes in float32
(and Paddle disables the GradScaler off-GPU), so each run must equal the float32 run and say once that it computed
in float32. What the low dtype and loss scaling do numerically only a GPU shows."""
import numpy as np
import pytest

from alignment.sft import run_sft
from tests.helpers import read_metrics
from tests.training.test_resume import sft_args, without_times


@pytest.fixture(scope="module")
def float32_run(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("fp32") / "out"
    run_sft.main(sft_args(out, tiny_model_dir, "--max_steps", "3", "--save_steps", "0"))
    return out


@pytest.mark.parametrize("flags", [("--bf16", "true"), ("--bf16", "true", "--fp16_opt_level", "O2"),
                                   ("--fp16", "true", "--scale_loss", "1024")],
                         ids=["bf16-O1", "bf16-O2", "fp16-O1-loss-scale"])
def test_mixed_precision_runs_on_cpu_in_float32_with_one_notice(float32_run, tmp_path, tiny_model_dir, capsys,
                                                                 flags):
    out = tmp_path / "out"
    run_sft.main(sft_args(out, tiny_model_dir, "--max_steps", "3", "--save_steps", "0", *flags))
    printed = capsys.readouterr().out
    assert printed.count("Paddle's CPU build has no") == 1 and "computes in float32" in printed
    rows, expected = without_times(read_metrics(out)), without_times(read_metrics(float32_run))
    if "--fp16" in flags:  # Paddle disables the GradScaler off-GPU: the logged scale is 1
        assert [r.pop("loss_scale") for r in rows] == [1.0] * 3
    for row, reference in zip(rows, expected):
        assert row.keys() == reference.keys()
        for key in row:
            np.testing.assert_allclose(row[key], reference[key], rtol=1e-6, err_msg=key)


def test_bf16_and_fp16_together_are_refused(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(SystemExit):
        run_sft.main(sft_args(tmp_path / "out", tiny_model_dir, "--bf16", "true", "--fp16", "true"))
    assert "'bf16' and 'fp16' are both true" in capsys.readouterr().err


def test_ppo_with_bf16_runs_the_amp_path_and_equals_float32(tmp_path, tiny_model_dir, tiny_reward_dir, monkeypatch):
    import contextlib

    from alignment.ppo import run_ppo
    from alignment.training.precision import Precision
    from tests.training.test_resume import ppo_args

    autocast, entered = Precision.autocast, {}

    def counting_autocast(self):  # the AMP context each forward entered: its dtype (None: float32, no context)
        context = autocast(self)
        entered.setdefault(run, []).append(None if isinstance(context, contextlib.nullcontext) else self.dtype)
        return context

    monkeypatch.setattr(Precision, "autocast", counting_autocast)
    runs = {}
    for run, flags in (("fp32", ()), ("bf16", ("--bf16", "true", "--fp16_opt_level", "O2"))):
        run_ppo.main(ppo_args(tmp_path / run, tiny_model_dir, tiny_reward_dir, "--max_steps", "2", "--save_steps",
                              "0", *flags))
        runs[run] = without_times(read_metrics(tmp_path / run))
    # every forward of the bf16 run (generation, scoring, actor and critic updates) ran under paddle's bf16
    # auto_cast, the float32 run's under none
    assert set(entered["fp32"]) == {None} and set(entered["bf16"]) == {"bfloat16"}
    assert len(entered["bf16"]) == len(entered["fp32"]) > 4
    assert len(runs["bf16"]) == len(runs["fp32"]) == 2
    for row, reference in zip(runs["bf16"], runs["fp32"]):
        for key in reference:
            np.testing.assert_allclose(row[key], reference[key], rtol=1e-6, atol=1e-7, err_msg=key)
