"""benchmarks/bench_cpu_ops.py compares like with like: each operation's Paddle call and torch call compute the
same numbers from the same inputs, and the docs' table renders a run's rows."""
import numpy as np
import paddle
import pytest

from benchmarks import bench_cpu_ops
from docsgen import results_tables


def as_numpy(value):
    if isinstance(value, (tuple, list)):  # Paddle's fused_rms_norm: (out, inv_rms); torch's max: (values, indices)
        value = value[0]
    return value.numpy() if isinstance(value, paddle.Tensor) else value.detach().numpy()


def test_each_operation_computes_the_same_numbers_in_both_libraries():
    torch = pytest.importorskip("torch")
    ops = bench_cpu_ops.operations(paddle, torch, score_layers=2)  # the scoring pass's GEMMs: 2 of its 30 layers
    assert len(ops) >= 10
    for name, (shape, ours, theirs) in ops.items():
        a, b = as_numpy(ours()), as_numpy(theirs())
        assert a.size == b.size, name  # Paddle's cross_entropy keeps a trailing axis of 1
        np.testing.assert_allclose(a.reshape(b.shape), b, rtol=2e-4, atol=2e-3, err_msg=name)


def test_without_torch_the_paddle_calls_still_run():
    ops = bench_cpu_ops.operations(paddle, None, score_layers=1)
    shape, ours, _ = ops["attention softmax"]
    assert list(ours().shape) == [int(n) for n in shape.split("x")]


def test_the_docs_table_renders_a_run():
    rows = [{"operation": "exp", "shape": "2x3", "paddle_ms": 3.0, "torch_ms": 1.5, "paddle_over_torch": 2.0},
            {"operation": "add", "shape": "2x3", "paddle_ms": 1.0},  # no torch: left out of the table
            {"operation": "silu", "shape": "2x3", "paddle_ms": 4.0, "torch_ms": 2.0, "paddle_over_torch": 2.0,
             "kernel_ms": 0.5}]  # our kernel: its time and its ratio to torch's
    cells = results_tables.TABLES["cpu_ops"].rows({"rows": rows})
    assert cells == [["exp", "2x3", "3.00", "1.50", "**2.00x**", "-", "-"],
                     ["silu", "2x3", "4.00", "2.00", "**2.00x**", "0.50", "**0.25x**"]]
