"""Helpers of the speculative decoding tests (tests/models/test_speculative.py, tests/models/test_speculative_draft.py):
a tiny model that copies runs of its prompt, prompts for it, the exact law of three sampled tokens from full forwards,
counts of sampled continuations, and Pearson's chi-square against them."""
import math

import numpy as np
import paddle

from alignment.models.engine import DecodeEngine, DecodeSequence
from alignment.models.logprobs import gather_log_probs
from alignment.models.sampling import block_tokens, sampling_logits
from tests.models.test_model import tiny_model


def copier(vocab=98, cycle=7, strength=4.0, damp=0.05):
    """The tiny LLaMA with a bigram boosted in its LM head: token t is mostly followed by the next token of t's
    cycle (0 -> 1 -> .. -> 6 -> 0, 7 -> ..), so answers repeat the prompt's runs and drafts get accepted; the
    attention and MLP outputs damped, not removed (they still move the logits)."""
    model = tiny_model(vocab_size=vocab)
    emb = model.model.embed_tokens.weight.numpy()
    follower = np.arange(vocab)
    for start in range(0, vocab - cycle + 1, cycle):
        follower[start:start + cycle] = np.roll(np.arange(start, start + cycle), -1)
    boost = np.zeros([emb.shape[1], vocab], "float32")
    boost[:, follower] = (emb / np.linalg.norm(emb, axis=1, keepdims=True)).T * strength
    model.lm_head.weight.set_value(model.lm_head.weight.numpy() + boost)
    for layer in model.model.layers:
        for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight):
            w.set_value(w.numpy() * damp)
    return model


PROMPTS = [[10, 11, 12, 13, 14, 3, 4, 5, 10], [0, 1, 2, 3, 4, 5, 6, 0, 1], [40, 41, 42, 90, 91, 92, 40, 41],
           [57, 23, 88, 9, 64, 31]]


def play_turns(model, config, draft=None):
    """PROMPTS[:2] in a 2-slot engine for 4 turns, each resumed with [30, 31, 32] -> (per prompt the turns, engine)."""
    engine = DecodeEngine(model, 2, 96, draft=draft)
    seqs = [DecodeSequence(p, config, 90) for p in PROMPTS[:2]]
    for seq in seqs:
        engine.add(seq)
    out = [[], []]
    for _ in range(4):
        while engine.busy():
            engine.step()
        for i, seq in enumerate(seqs):
            out[i].append(list(seq.turn))
            engine.resume(seq, [30, 31, 32])
    return out, engine


def assert_log_probs_are_a_full_forwards(model, ids, mask, out):
    """generate's log-probs (temperature 1) within 1e-5 of one forward over each row's prompt and response."""
    for row in range(ids.shape[0]):
        n = int(out.response_mask[row].sum())
        prompt = ids[row][mask[row] > 0].numpy().tolist()
        turn = out.sequences[row, ids.shape[1]:ids.shape[1] + n].numpy().tolist()
        np.testing.assert_allclose(out.log_probs[row, :n].numpy(),
                                   full_forward_log_probs(model, prompt, turn, 1.0).squeeze(-1), atol=1e-5)


def full_forward_log_probs(model, prompt, turn, temperature):
    ids = paddle.to_tensor([prompt + turn])
    logits = model(ids).logits[0, len(prompt) - 1:-1]  # [len(turn), vocab]
    return gather_log_probs(paddle.scale(logits, 1.0 / temperature), paddle.to_tensor(turn).unsqueeze(-1)).numpy()


def chi_square_critical(dof: int, z: float = 3.09) -> float:
    """The chi-square quantile at 1 - 0.001 (z: the normal's), Wilson-Hilferty's approximation."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(counts: np.ndarray, expected: np.ndarray):
    """Pearson's statistic over the cells expecting >= 5 draws, the others pooled into one; -> (statistic, dof)."""
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    return float(((observed - wanted) ** 2 / wanted).sum()), len(observed) - 1


def sampler_probabilities(model, prompt, config, vocab):
    """The sampler's exact distributions after `prompt` + every two-token continuation, from full forwards through
    its processing (repetition penalty, eos block, temperature, top-k, top-p) -> [t1, t2, pos, next]: position 0
    after the prompt, 1 after t1, 2 after t2."""
    pairs = np.array([[a, b] for a in range(vocab) for b in range(vocab)])  # [v v, 2]
    ids = np.concatenate([np.tile(prompt, [len(pairs), 1]), pairs], axis=1)  # [v v, P + 2]
    logits = model(paddle.to_tensor(ids)).logits[:, -3:].reshape([-1, vocab])  # [v v 3, vocab]: after P, t1, t2
    seen = np.zeros([len(pairs), 3, vocab], bool)  # [v v, 3, vocab]: the ids before each position
    for i, row in enumerate(ids):
        for j in range(3):
            seen[i, j, row[:len(prompt) + j]] = True
    if config.eos_ids:
        under = np.tile(np.arange(3) < config.min_new_tokens, len(pairs))  # [v v 3]
        logits = block_tokens(logits, config.eos_ids, paddle.to_tensor(under))
    processed = sampling_logits(logits, config, paddle.to_tensor(seen.reshape([-1, vocab])))
    return paddle.nn.functional.softmax(processed).numpy().reshape([vocab, vocab, 3, vocab])


def sample_counts(engine, prompt, config, draws, vocab):
    """[t1, t2, t3] counts of `draws` three-token continuations of `prompt` sampled by `engine` (100 slots), each
    sequence with its own rng."""
    counts, rng = np.zeros([vocab] * 3), 0
    while counts.sum() < draws:
        seqs = [DecodeSequence(prompt, config, 14, rng=np.random.default_rng([11, rng + i])) for i in range(100)]
        rng += 100
        for seq in seqs:
            engine.add(seq)
        while engine.busy():
            engine.step()
        for seq in seqs:
            counts[tuple(seq.turn)] += 1
            engine.release(seq)
    return counts
