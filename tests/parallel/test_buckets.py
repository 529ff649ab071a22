"""alignment/parallel/buckets.py: gradients cut into runs of one dtype within the byte limit, in order, and each
tensor (a parameter's own gradient too) left holding its elements of the bucket's reduced, scaled buffer."""
import numpy as np
import paddle

from alignment.parallel.buckets import buckets, reduce_in_buckets


def tensors(*specs):
    """(elements, dtype) -> tensors of 1, 2, 3, ... in order."""
    return [paddle.full([n], i + 1, dtype=dtype) for i, (n, dtype) in enumerate(specs)]


def test_runs_keep_the_order_split_at_the_limit_and_at_a_dtype_change():
    ts = tensors((4, "float32"), (4, "float32"), (4, "float32"), (2, "float64"), (2, "float64"), (4, "float32"))
    assert buckets(ts, limit_bytes=32) == [[0, 1], [2], [3, 4], [5]]  # 16 + 16 bytes fill a bucket of 32
    assert buckets(ts, limit_bytes=1 << 20) == [[0, 1, 2], [3, 4], [5]]


def test_a_tensor_larger_than_the_limit_is_a_run_of_its_own_and_no_tensors_no_runs():
    ts = tensors((2, "float32"), (100, "float32"), (2, "float32"))
    assert buckets(ts, limit_bytes=16) == [[0], [1], [2]]
    assert buckets([], limit_bytes=16) == []


def test_each_tensor_holds_its_elements_of_the_reduced_scaled_buffer_with_one_call_per_bucket():
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(shape).astype(dtype) for shape, dtype in
              [((3, 2), "float32"), ((5,), "float32"), ((2, 2), "float64"), ((7,), "float32")]]
    ts = [paddle.to_tensor(v) for v in values]
    calls = []

    def reduce(flat):  # stands for a sum over two ranks holding the same numbers
        calls.append(int(flat.size))
        flat.scale_(2.0)

    reduce_in_buckets(ts, reduce, 0.25, limit_bytes=44)
    assert calls == [11, 4, 7]  # (6 + 5) float32, then the float64 tensor, then a float32 run again
    for t, v in zip(ts, values):
        assert t.shape == list(v.shape) and t.dtype == paddle.to_tensor(v).dtype
        np.testing.assert_array_equal(t.numpy(), v * 2 * v.dtype.type(0.25))


def test_the_result_reaches_the_parameters_own_gradients():
    paddle.seed(0)
    layer = paddle.nn.Linear(3, 4)
    layer(paddle.randn([5, 3])).sum().backward()
    before = [p.grad.numpy().copy() for p in layer.parameters()]
    reduce_in_buckets([p.grad for p in layer.parameters()], lambda flat: flat.scale_(3.0), 0.5)
    for p, b in zip(layer.parameters(), before):  # read afresh: what the optimizer reads
        np.testing.assert_array_equal(p.grad.numpy(), b * np.float32(3.0) * np.float32(0.5))
