"""Mutation testing of the RL math, the masks and the features the default tests name (issue 57): each mutation
breaks one line on purpose, in a copy of the checkout, and the tests it names must then fail. Not part of the
default suite (it runs pytest once per mutation: minutes). See docs/getting-started/testing.md.

    python tests/scripts/mutate.py                      # every mutation; exit 1 if one survives
    python tests/scripts/mutate.py --list               # the mutations and the tests each runs
    python tests/scripts/mutate.py gae-gamma dpo-ipo    # some of them (names, or prefixes ending in '*')

The checkout itself is never edited: it is copied once (without .git and outputs) to a temporary directory,
each mutation is applied to the copy, the tests run there (conftest.py imports the package from the copy), and
the file is restored. A mutation whose line is no longer in the file is reported as stale (edit it here).
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, NamedTuple, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Mutation(NamedTuple):
    name: str
    path: str  # relative to the checkout
    old: str  # must occur exactly once in the file
    new: str
    tests: Sequence[str]  # pytest arguments: files or node ids, and at most one "-k" expression (for all of them)


def m(name, path, old, new, *tests):
    return Mutation(name, path, old, new, tests)


ALG, EST, SUR, KL, DAPO = ("alignment/ppo/rl_math/algorithms.py", "alignment/ppo/rl_math/estimators.py",
                           "alignment/ppo/rl_math/surrogate.py", "alignment/ppo/rl_math/kl.py",
                           "alignment/ppo/rl_math/dapo.py")
DPO_LOSSES, ROLLOUT, EPISODES = ("alignment/dpo/losses.py", "alignment/ppo/rollout/rollout.py",
                                  "alignment/ppo/rollout/episodes.py")
T_ALG, T_RECIPE = "tests/ppo/test_algorithms.py", "tests/ppo/test_recipe_math.py"
SAMPLING = "alignment/models/sampling.py"
T_SAMPLING = ("tests/models/test_model.py", "tests/models/test_engine.py", "tests/models/test_fused_decode.py",
              "tests/envs/test_multiturn.py")

MUTATIONS: List[Mutation] = [
    # ---- algorithms.py: masked statistics, GAE, end rewards, critic loss
    m("masked-where", ALG, "return paddle.where(mask > 0, product, paddle.zeros_like(product))",
      "return product", T_ALG),
    m("safe-div-zero", ALG, "return paddle.where(ok, num / paddle.where(ok, den, paddle.ones_like(den)), "
      "paddle.zeros_like(num))", "return num / den", T_ALG),
    m("var-biased", ALG, "return sq / paddle.clip(n - 1.0, min=1.0) if unbiased else _safe_div(sq, n)",
      "return _safe_div(sq, n)", T_ALG),
    m("whiten-ranks-biased", ALG, "/ paddle.clip(totals[1] - 1.0, min=1.0)", "/ paddle.clip(totals[1], min=1.0)",
      T_ALG),
    m("whiten-shift-mean", ALG, "    if not shift_mean:\n", "    if shift_mean:\n", T_ALG),
    m("gae-gamma", ALG, "delta = rewards[:, t] + gamma * next_value - values[:, t]",
      "delta = rewards[:, t] + next_value - values[:, t]", T_ALG),
    m("gae-lambda", ALG, "adv = (delta + gamma * lam * next_adv) * mask[:, t]",
      "adv = (delta + gamma * next_adv) * mask[:, t]", T_ALG),
    m("gae-skip-observations", ALG, "next_value = paddle.where(step, values[:, t], next_value)",
      "next_value = values[:, t]", T_ALG, "tests/ppo/test_multiturn_training.py"),
    m("gae-returns", ALG, "return advantages, advantages + values  # [B, T], [B, T]",
      "return advantages, advantages  # [B, T], [B, T]", T_ALG),
    m("vapo-lambda-alpha", ALG, "1.0 - 1.0 / (alpha * lengths)", "1.0 - 1.0 / lengths",
      "tests/config/test_estimators.py", "-k", "vapo_decouples"),
    m("last-valid-first", ALG, "return (positions * (mask > 0).astype(\"int64\")).max(axis=1) - 1",
      "return (positions * (mask > 0).astype(\"int64\")).max(axis=1) - 2", T_ALG),
    m("kl-reward-sign", ALG, "return -kl_coeff * kl + _end_reward(scores, mask), kl",
      "return kl_coeff * kl + _end_reward(scores, mask), kl", T_ALG),
    m("score-unclipped", ALG, "scores = paddle.clip(_f32(end_scores), -clip_range_score, clip_range_score)",
      "scores = _f32(end_scores)", T_ALG),
    m("sequence-kl-token-mean", ALG, "return masked_sum(kl_estimate(log_probs, ref_log_probs), mask, axis=1).mean()",
      "return masked_mean(kl_estimate(log_probs, ref_log_probs), mask)", T_ALG),
    m("critic-min", ALG, "losses = paddle.maximum((values - returns).square(), (clipped - returns).square())",
      "losses = paddle.minimum((values - returns).square(), (clipped - returns).square())", T_ALG),
    m("critic-unclipped", ALG, "clipped = old_values + paddle.clip(values - old_values, -clip_range_value, "
      "clip_range_value)", "clipped = values", T_ALG),
    m("sample-std-ddof0", ALG, "/ max(n - 1, 1)).sqrt()", "/ max(n, 1)).sqrt()", T_ALG),
    m("groups-global-mean", ALG, "return grouped, grouped - grouped.mean(axis=1, keepdim=True)",
      "return grouped, grouped - grouped.mean()", T_ALG),
    m("rpp-gamma", ALG, "returns, _ = compute_gae(paddle.zeros_like(_f32(rewards)), rewards, mask, gamma, 1.0)",
      "returns, _ = compute_gae(paddle.zeros_like(_f32(rewards)), rewards, mask, 1.0, 1.0)", T_ALG),
    m("explained-variance-sign", ALG, "1.0 - var_err / paddle.where", "var_err / paddle.where", T_ALG),
    # ---- estimators.py
    m("turn-rewards-twice", EST, "end = end - rollout.turn_rewards.sum(axis=1)  # [N]", "end = end  # [N]",
      "tests/ppo/test_multiturn_training.py", "-k", "per_turn"),
    m("gae-not-whitened", EST, "        if ppo.normalize_advantage:\n            advantages = rl.masked_whiten("
      "advantages, rollout.response_mask, reduce_sum=reduce_sum)",
      "        if False:\n            advantages = rl.masked_whiten(advantages, rollout.response_mask, "
      "reduce_sum=reduce_sum)", "tests/config/test_estimators.py"),
    m("kl-in-reward-always", EST, "return 0.0 if ppo.kl_in_loss else ppo.kl_coeff", "return ppo.kl_coeff",
      "tests/config/test_estimators.py"),
    m("vapo-critic-lambda", EST, "return rl.compute_gae(rollout.old_values, rewards, rollout.response_mask, "
      "ppo.gamma, 1.0)[1]", "return rl.compute_gae(rollout.old_values, rewards, rollout.response_mask, ppo.gamma, "
      "ppo.gae_lambda)[1]", "tests/config/test_estimators.py", "-k", "vapo_decouples"),
    m("grpo-no-std", EST, "return (centered / (rl.sample_std(grouped, axis=1, keepdim=True) + eps)).reshape([-1])",
      "return centered.reshape([-1])", T_ALG),
    m("rloo-no-scale", EST, "return (centered * group_size / (group_size - 1)).reshape([-1])",
      "return centered.reshape([-1])", T_ALG),
    m("baseline-group-std", EST, "return (centered / (rl.sample_std(centered) + eps)).reshape([-1])",
      "return (centered / (rl.sample_std(centered, axis=1, keepdim=True) + eps)).reshape([-1])", T_ALG),
    # ---- surrogate.py
    m("agg-token-mean-as-seq", SUR, "    if mode == \"token-mean\":\n        return masked_mean(per_token_loss, mask)",
      "    if mode == \"token-mean\":\n        mode = \"seq-mean-token-mean\"", T_ALG, T_RECIPE),
    m("agg-norm-constant", SUR, "per_row = per_row / float(constant)", "per_row = per_row", T_RECIPE),
    m("agg-empty-rows-count", SUR, "return masked_mean(per_row, mask.sum(axis=1) > 0)", "return per_row.mean()",
      T_RECIPE),
    m("ratio-unmasked", SUR, "log_ratio = _masked(_f32(log_probs) - _f32(old_log_probs), _f32(mask))  # [B, T]",
      "log_ratio = _f32(log_probs) - _f32(old_log_probs)  # [B, T]", T_ALG, T_RECIPE),
    m("clip-symmetric", SUR, "clipped = paddle.clip(ratio, 1.0 - low, 1.0 + high)  # [B, T]",
      "clipped = paddle.clip(ratio, 1.0 - low, 1.0 + low)  # [B, T]", T_RECIPE),
    m("clip-min", SUR, "losses = paddle.maximum(-advantages * ratio, -advantages * clipped)  # [B, T]",
      "losses = paddle.minimum(-advantages * ratio, -advantages * clipped)  # [B, T]", T_ALG),
    m("gspo-token-ratio", SUR, "token_log_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach()"
      ".unsqueeze(1)  # [B, T]  value log s_i", "token_log_ratio = log_ratio  # [B, T]", T_RECIPE),
    m("clip-frac-threshold", SUR, "((ratio - 1.0).abs() > clip_range)", "((ratio - 1.0).abs() >= 0.0)", T_ALG),
    m("approx-kl-k1", SUR, "clip_range).astype(\"float32\"), mask),\n                 \"approx_kl\": masked_mean("
      "ratio - 1.0 - log_ratio, mask)", "clip_range).astype(\"float32\"), mask),\n                 \"approx_kl\": "
      "masked_mean(-log_ratio, mask)", T_ALG),
    m("entropy-sign", SUR, "return _f32(policy_loss) - entropy_coeff * entropy, entropy.detach()",
      "return _f32(policy_loss) + entropy_coeff * entropy, entropy.detach()", T_RECIPE),
    m("kl-loss-unmasked", SUR, "log_probs, ref_log_probs = _masked(log_probs, mask), _masked(ref_log_probs, mask)"
      "  # [B, T]", "pass", T_RECIPE, "tests/ppo/test_multiturn_training.py", "-k", "kl or never_reach"),
    # ---- kl.py
    m("k2-half", KL, "return 0.5 * K1.estimate(log_probs, ref_log_probs).square()  # [B, T]",
      "return K1.estimate(log_probs, ref_log_probs).square()  # [B, T]", T_ALG),
    m("k3-sign", KL, "return paddle.exp(-log_ratio) + log_ratio - 1.0  # [B, T]",
      "return paddle.exp(log_ratio) - log_ratio - 1.0  # [B, T]", T_ALG),
    m("low-var-kl-unclamped", KL, "return paddle.clip(paddle.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)",
      "return paddle.exp(log_ratio) - log_ratio - 1.0", T_RECIPE),
    m("straight-through-k1-grad", KL, "return k2 - k2.detach() + kl.detach()",
      "return kl - kl.detach() + kl.detach()", T_RECIPE),
    # ---- dapo.py
    m("spread-ddof", DAPO, "return std > tol if group_size > 1", "return std >= tol if group_size > 1",
      "tests/ppo/test_dynamic_sampling.py"),
    m("overlong-unclamped", DAPO, "return -penalty_factor * paddle.clip(excess / overlong_buffer_len, max=1.0)",
      "return -penalty_factor * excess / overlong_buffer_len", T_RECIPE),
    m("overlong-buffer-start", DAPO, "- (max_resp_len - overlong_buffer_len), min=0.0)",
      "- max_resp_len, min=0.0)", T_RECIPE),
    m("truncated-ignores-eos", DAPO, "return (_as(response_lengths, \"float32\") >= max_resp_len) & "
      "~_as(ends_with_eos, \"bool\")", "return _as(response_lengths, \"float32\") >= max_resp_len", T_RECIPE),
    m("truncated-not-masked", DAPO, "return _as(mask, \"float32\") * keep  # [B, T]",
      "return _as(mask, \"float32\")  # [B, T]", T_RECIPE, "tests/ppo/test_ppo_recipes.py", "-k", "truncated"),
    # ---- dpo/losses.py
    m("dpo-label-smoothing", DPO_LOSSES, "return -(1 - label_smoothing) * F.log_sigmoid(logits) - label_smoothing",
      "return -F.log_sigmoid(logits) - 0.0", "tests/dpo/test_dpo.py", "tests/dpo/test_dpo_variants.py"),
    m("dpo-ipo-margin", DPO_LOSSES, "return (c - r - 1.0 / (2.0 * o[\"beta\"])) ** 2",
      "return (c - r - 1.0 / o[\"beta\"]) ** 2", "tests/dpo/test_dpo.py", "tests/dpo/test_dpo_variants.py"),
    m("dpo-hinge", DPO_LOSSES, "return F.relu(1.0 - o[\"beta\"] * (c - r))", "return F.relu(-o[\"beta\"] * (c - r))",
      "tests/dpo/test_dpo.py", "tests/dpo/test_dpo_variants.py"),
    m("dpo-simpo-gamma", DPO_LOSSES, "o[\"beta\"] * (c - r) - o[\"simpo_gamma\"]", "o[\"beta\"] * (c - r)",
      "tests/dpo/test_dpo.py", "tests/dpo/test_dpo_variants.py"),
    m("dpo-dpop-penalty", DPO_LOSSES, "paddle.clip(-c, min=0.0)", "paddle.clip(c, min=0.0)", "tests/dpo/test_dpo.py",
      "tests/dpo/test_dpo_variants.py"),
    m("dpo-kto-pair-clip", DPO_LOSSES, "chosen_kl, rejected_kl = paddle.clip(c.mean(), min=0.0), paddle.clip("
      "r.mean(), min=0.0)", "chosen_kl, rejected_kl = c.mean(), r.mean()", "tests/dpo/test_dpo.py",
      "tests/dpo/test_dpo_variants.py"),
    m("dpo-sppo-sign", DPO_LOSSES, "return (c - half) ** 2 + (r + half) ** 2",
      "return (c - half) ** 2 + (r - half) ** 2",
      "tests/dpo/test_dpo.py", "tests/dpo/test_dpo_variants.py"),
    m("dpo-nca-weight", DPO_LOSSES, "- 0.5 * F.log_sigmoid(-beta * c) - 0.5 * F.log_sigmoid(-beta * r)",
      "- 0.5 * F.log_sigmoid(-beta * r)", "tests/dpo/test_dpo.py", "tests/dpo/test_dpo_variants.py"),
    m("dpo-or-odds", DPO_LOSSES, "- (paddle.log1p(-paddle.exp(c)) - paddle.log1p(-paddle.exp(r)))", "",
      "tests/dpo/test_dpo.py", "tests/dpo/test_dpo_variants.py"),
    m("dpo-average-flag", DPO_LOSSES, "NAME = \"ipo\"\n    token_averaged = True",
      "NAME = \"ipo\"\n    token_averaged = False",
      "tests/dpo/test_dpo.py", "tests/dpo/test_dpo_variants.py"),
    m("kto-kl-unclamped", DPO_LOSSES, "return paddle.clip((policy_mismatched - ref_mismatched).mean(), min=0.0)"
      ".detach()", "return (policy_mismatched - ref_mismatched).mean().detach()", "tests/dpo/test_dpo.py"),
    m("kto-weights-swapped", DPO_LOSSES, "desirable_losses = desirable_weight * (1 - F.sigmoid(beta * (ratio - kl)))",
      "desirable_losses = undesirable_weight * (1 - F.sigmoid(beta * (ratio - kl)))", "tests/dpo/test_dpo.py"),
    # ---- rollout.py / episodes.py: the masks and the layout
    m("rollout-mask-padding-trained", ROLLOUT, "response_mask=response_mask.astype(\"float32\"),",
      "response_mask=paddle.ones_like(response_mask).astype(\"float32\"),", "tests/ppo/test_rollout_trim.py"),
    m("packed-index", ROLLOUT, "index = np.minimum(prompt_lens[:, None] + np.arange(keep)[None], width - 1)",
      "index = np.minimum(prompt_lens[:, None] + np.arange(keep)[None] - 1, width - 1)",
      "tests/ppo/test_rollout_trim.py"),
    m("trimmed-width", ROLLOUT, "last = np.where(mask.any(axis=1), mask.shape[1] - np.argmax(mask[:, ::-1], "
      "axis=1), 0)", "last = np.where(mask.any(axis=1), mask.shape[1] - np.argmax(mask[:, ::-1], axis=1) - 1, 0)",
      "tests/ppo/test_rollout_trim.py"),
    m("logprob-offset", ROLLOUT, "states, labels = hidden[:, prompt_len - 1: -1], input_ids[:, prompt_len:]",
      "states, labels = hidden[:, prompt_len:], input_ids[:, prompt_len:]", "tests/ppo/test_ppo.py", "-k",
      "line_up"),
    m("values-offset", ROLLOUT, "return scores[:, prompt_len - 1: -1]", "return scores[:, prompt_len:]",
      "tests/ppo/test_ppo.py", "-k", "line_up"),
    m("turn-reward-position", EPISODES, "turn_rewards[i, end - t.prompt_len] += per_turn_weight * reward",
      "turn_rewards[i, end - t.prompt_len - 1] += per_turn_weight * reward", "tests/ppo/test_multiturn_training.py",
      "tests/envs/test_multiturn.py"),
    m("turn-reward-weight", EPISODES, "turn_rewards[i, end - t.prompt_len] += per_turn_weight * reward",
      "turn_rewards[i, end - t.prompt_len] += reward", "tests/ppo/test_multiturn_training.py",
      "tests/envs/test_multiturn.py"),
    m("episode-mask-all", EPISODES, "response_mask=paddle.to_tensor(batch[\"action_mask\"].astype(\"float32\")),",
      "response_mask=paddle.to_tensor((batch[\"attention_mask\"][:, batch[\"prompt_len\"]:]).astype(\"float32\")),",
      "tests/ppo/test_multiturn_training.py", "tests/envs/test_multiturn.py"),
    # ---- sampling: the filters and the draw every rollout token goes through
    m("top-p-drops-the-crossing-token", SAMPLING, "paddle.where(mass_before >= p,",
      "paddle.where(mass_before + sorted_probs >= p,",
      *T_SAMPLING),
    m("top-k-drops-kth", SAMPLING, "paddle.where(logits < kth,", "paddle.where(logits <= kth,", *T_SAMPLING),
    m("repetition-penalty-sign", SAMPLING, "penalised = paddle.where(logits > 0, logits / penalty, logits * penalty)",
      "penalised = paddle.where(logits > 0, logits * penalty, logits / penalty)", *T_SAMPLING),
    m("temperature-inverted", SAMPLING, "        logits = logits / config.temperature",
      "        logits = logits * config.temperature", *T_SAMPLING),
    m("draw-left-of-target", SAMPLING, "paddle.searchsorted(cdf, target, right=True)",
      "paddle.searchsorted(cdf, target, right=False)", *T_SAMPLING),
    m("min-new-tokens-off-by-one", "alignment/models/engine.py", "under[s.slot] = len(s.turn) < config.min_new_tokens",
      "under[s.slot] = len(s.turn) < config.min_new_tokens - 1", *T_SAMPLING),
    # ---- the features the weak tests of issue 57 name: each of these passed the test as it was
    m("dpo-step-loss-type", "alignment/dpo/dpo_trainer.py", "counts[:b], counts[b:], dpo.loss_type, dpo.beta,",
      "counts[:b], counts[b:], \"sigmoid\", dpo.beta,", "tests/dpo/test_dpo_variants.py", "-k", "trains_a_step"),
    m("kto-desirable-weight", "alignment/dpo/dpo_trainer.py", "dpo.beta, dpo.desirable_weight,",
      "dpo.beta, 1.0,", "tests/config/test_algorithm_of_files.py", "-k", "kto_rows"),
    m("group-estimators-as-dr-grpo", EST, "per_response = self.per_response(rollout.end_rewards, "
      "ppo.num_return_sequences)  # [N]", "per_response = DrGRPO.per_response(rollout.end_rewards, "
      "ppo.num_return_sequences)  # [N]", "tests/ppo/test_ppo.py", "-k", "critic_free"),
    m("prm-mean-of-steps", "alignment/rewards/process.py", "out[i] = float(good[start: start + count].min())",
      "out[i] = float(good[start: start + count].mean())", "tests/rm/test_process_reward.py", "-k", "grpo"),
    m("dpo-reference-dropped", "alignment/dpo/dpo_trainer.py", "        if self.reference is None:  # reference-free",
      "        if True:  # reference-free", "tests/data/test_paddlenlp_data.py",
      "tests/config/test_paddleformers_files.py", "-k", "dpo"),
    m("tool-time-not-measured", "alignment/envs/tool_env.py", "\"tool_time\": float(sum(result.seconds for result in "
      "results))}", "\"tool_time\": 0.0}", "tests/envs/test_envs.py", "-k", "calls_then_ends"),
    m("env-reward-unweighted", "alignment/ppo/rollout/scoring.py",
      "paddle.to_tensor((weight * rewards).astype(\"float32\"))", "paddle.to_tensor(rewards.astype(\"float32\"))",
      "tests/ppo/test_multiturn_training.py", "-k", "env_reward_weight"),
    m("kto-takes-any-loss", "alignment/config/dpo.py", "        if self.loss_type not in PREFERENCE_LOSSES or "
      "self.loss.paired:", "        if False:", "tests/config/test_algorithm_of_files.py", "-k", "refuses_another"),
    m("ptx-not-trained", "alignment/ppo/learner/ptx.py", "return self.coeff * scale * loss, {",
      "return 0.0 * loss, {", "tests/config/test_paddlenlp_files.py", "-k", "llama_ppo"),
    m("reward-never-normalised", "alignment/ppo/ppo_trainer.py",
      "self.reward_stats if self.ppo.normalize_reward else None", "None", "tests/training/test_resume.py", "-k",
      "ppo_killed"),
    m("one-update-pass", "alignment/ppo/learner/update.py", "for _ in range(ppo.update_iters):", "for _ in range(1):",
      "tests/ppo/test_ppo.py", "tests/ppo/test_split_invariance.py"),
    m("amp-context-skipped", "alignment/training/precision.py", "        if not self.enabled:\n            return "
      "contextlib.nullcontext()", "        if True:\n            return contextlib.nullcontext()",
      "tests/training/test_precision.py", "-k", "ppo_with_bf16"),
    m("documented-key-untested", "docs/recipes/grpo.md", "| `num_return_sequences` | 4 |",
      "| `num_return_sequences`, `undesirable_weight` | 4 |", "tests/docs/test_documented_keys.py"),
    m("offload-nothing", "alignment/wrappers/offload.py", "_move(self._eligible(models, optimizers) if self.levels "
      "else [], host_place())", "_move([], host_place())", "tests/wrappers/test_offload.py", "-k", "ppo"),
    m("offload-no-optimizer", "alignment/wrappers/offload.py", "        if \"optimizer\" in self.levels:",
      "        if \"optimizers\" in self.levels:", "tests/wrappers/test_offload.py", "-k", "ppo"),
    m("tool-trace-wrong-result", "data/tool_arithmetic/sft_tools.jsonl", "\"content\": \"2953541\"}, {\"role\": "
      "\"assistant\", \"content\": \"The answer is 2953541.\"}", "\"content\": \"2953542\"}, {\"role\": "
      "\"assistant\", \"content\": \"The answer is 2953542.\"}", "tests/data/test_tool_arithmetic_data.py", "-k",
      "disjoint"),
    m("tool-heldout-wrong-answer", "data/tool_arithmetic/heldout.jsonl", "\"answer\": \"7402583\"",
      "\"answer\": \"7402584\"", "tests/data/test_tool_arithmetic_data.py", "-k", "disjoint"),
    m("env-metrics-lost-with-dynamic-sampling", "alignment/ppo/ppo_trainer.py",
      "metrics.update(self.policy_sampler.metrics(rollout))",
      "metrics.update({} if self.ppo.dynamic_sampling else self.policy_sampler.metrics(rollout))",
      "tests/ppo/test_multiturn_training.py", "-k", "lora_offload"),
    m("bad-input-exit-1", "alignment/training/setup.py", "def fail(error, code: int = 2, prefix",
      "def fail(error, code: int = 1, prefix", "tests/config/test_bad_inputs.py", "-k", "clear_error"),
    m("refused-checkpoint-exit-1", "alignment/training/setup.py", "def fail(error, code: int = 2, prefix",
      "def fail(error, code: int = 1, prefix", "tests/repo/test_no_code_loading.py", "-k", "crafted"),
    m("kl-in-loss-coefficient-doubled", "alignment/ppo/rl_math/objective.py",
      "loss = loss + ppo.kl_coeff * sur.kl_loss(", "loss = loss + 2 * ppo.kl_coeff * sur.kl_loss(",
      "tests/benchmarks/test_parity_trl.py"),
    m("async-serialised", "alignment/ppo/asynchronous/rollout_worker.py", "times[\"sample_start\"] = time.time()",
      "time.sleep(3); times[\"sample_start\"] = time.time()", "-m", "parallel", "tests/ppo/test_async_runs.py", "-k",
      "staleness_1"),
]


def copy_checkout(target: str) -> str:
    ignore = shutil.ignore_patterns(".git", "__pycache__", "outputs", "checkpoints", "exported", ".venv*", "site",
                                    ".pytest_cache", ".import_linter_cache", "*.egg-info", "build")
    shutil.copytree(REPO, target, ignore=ignore, symlinks=True)
    return target


def run_tests(root: str, tests: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", *tests],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def first_failure(out: str) -> str:
    found = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M)
    return found[0] if found else ""


def selected(names: Sequence[str]) -> List[Mutation]:
    if not names:
        return list(MUTATIONS)
    chosen = [mu for mu in MUTATIONS if any(fnmatch.fnmatch(mu.name, pattern) for pattern in names)]
    unknown = [n for n in names if not any(fnmatch.fnmatch(mu.name, n) for mu in MUTATIONS)]
    if unknown:
        sys.exit(f"error: no mutation named {', '.join(unknown)} (--list shows them)")
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all); shell-style patterns")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests, run nothing")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated tests")
    parser.add_argument("--tests-at", metavar="REV", help="run the tests/ of this git revision against the mutants "
                        "(shows which mutants an older suite let through)")
    args = parser.parse_args(argv)
    names = [mu.name for mu in MUTATIONS]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        sys.exit(f"error: mutation names used twice: {duplicated}")
    chosen = selected(args.names)
    if args.list:
        for mu in chosen:
            print(f"{mu.name:<28} {mu.path:<32} {' '.join(mu.tests)}")
        return 0
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        root = copy_checkout(os.path.join(tmp, "checkout"))
        if args.tests_at:
            shutil.rmtree(os.path.join(root, "tests"))
            archive = subprocess.run(["git", "archive", args.tests_at, "tests"], cwd=REPO, capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
        if not args.no_baseline:
            tests = sorted({test for mu in chosen for test in mu.tests if test.startswith("tests/")})
            done = run_tests(root, tests, args.timeout * 4)
            if done.returncode != 0:
                print(done.stdout[-3000:])
                print(f"error: the unmutated tests fail ({first_failure(done.stdout)}); fix them first")
                return 2
            print(f"baseline: {len(tests)} test files pass unmutated")
        survived = stale = 0
        for mu in chosen:
            path = os.path.join(root, mu.path)
            original = open(path, encoding="utf-8").read()
            if original.count(mu.old) != 1:
                stale += 1
                print(f"{mu.name:<28} STALE (the line occurs {original.count(mu.old)} times in {mu.path})")
                continue
            files = [t for t in mu.tests if t.startswith("tests/")]
            if not any(os.path.exists(os.path.join(root, t.split("::")[0])) for t in files):
                survived += 1
                print(f"{mu.name:<28} SURVIVED (no test: {' '.join(files)} not in this tests/)")
                continue
            start = time.time()
            try:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original.replace(mu.old, mu.new))
                done = run_tests(root, mu.tests, args.timeout)
            finally:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(original)
            seconds = time.time() - start
            if done.returncode == 0:
                survived += 1
                print(f"{mu.name:<28} SURVIVED ({' '.join(mu.tests)}) {seconds:.0f}s")
            elif done.returncode == 5:  # nothing selected: no test could notice the mutant
                survived += 1
                print(f"{mu.name:<28} SURVIVED (no test selected by {' '.join(mu.tests)}) {seconds:.0f}s")
            elif done.returncode == 1:
                print(f"{mu.name:<28} killed by {first_failure(done.stdout)} {seconds:.0f}s")
            else:  # collection error, interrupted, no tests: the mutation broke the import, not a test
                print(f"{mu.name:<28} killed (pytest exit {done.returncode}: {first_failure(done.stdout) or 'error'})"
                      f" {seconds:.0f}s")
            sys.stdout.flush()
    print(f"{len(chosen)} mutations: {len(chosen) - survived - stale} killed, {survived} survived, {stale} stale")
    return 1 if survived or stale else 0


if __name__ == "__main__":
    sys.exit(main())
