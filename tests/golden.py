"""Shared pieces of the golden-value tests of the RL math (tests/ppo/test_algorithms.py,
tests/ppo/test_recipe_math.py)."""
import numpy as np
import paddle

INF = float("inf")


def t(x, dtype="float32"):
    return paddle.to_tensor(np.asarray(x, dtype=dtype))


def close(actual, expected, atol=1e-5):
    actual = actual.numpy() if isinstance(actual, paddle.Tensor) else np.asarray(actual)
    np.testing.assert_allclose(actual, np.asarray(expected, dtype=np.float64), rtol=1e-5, atol=atol)


def response_mask(prompt_len, response_len, width):
    """Mask built from lengths (never from ids != pad, which breaks when eos == pad)."""
    return [[1.0 if p <= i < p + r else 0.0 for i in range(width)] for p, r in zip(prompt_len, response_len)]


def ppo_case():
    # eps = 0.2; tokens (rho, A):
    # (1.5, +1): max(-1.5, -1.2) = -1.2 clipped | (0.5, +1): max(-0.5, -0.8) = -0.5
    # (0.5, -1): max(0.5, 0.8) = 0.8 clipped    | (1.5, -1): max(1.5, 1.2) = 1.5
    # (1.1, +2): max(-2.2, -2.2) = -2.2          | masked (rho = e^30, A = 100)
    # loss = (-1.2 - 0.5 + 0.8 + 1.5 - 2.2) / 5 = -0.32   (unclipped would be -2.2 / 5 = -0.44)
    old = np.array([[-1.0, -2, -1, -3, -2, -40]])
    log_rho = np.log([[1.5, 0.5, 0.5, 1.5, 1.1, 1.0]]) + np.array([[0, 0, 0, 0, 0, 30]])
    lp = t(old + log_rho)
    lp.stop_gradient = False
    return lp, t(old), t([[1.0, 1, -1, -1, 2, 100]]), t([[1.0, 1, 1, 1, 1, 0]])
