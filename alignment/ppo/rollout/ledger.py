"""The rollout ledger: every trained sample, one JSON line, in <output_dir>/ledger/ (and, with dynamic sampling,
every sample drawn and not trained: {"step", "sample", "dropped": why}).

Each row: the step that trained it, its `sample` id ("batch:row:prompt": its place in the prompt stream and the
prompt's index in the dataset), the prompt, the policy version that sampled it (the step's own for a synchronous
run; with partial rollouts also `token_versions`, one per policy token), the digest of the weights that sampled it
and which sampler that was ("weights_digest", "sampled_by": weight_check.py), the prompt's and the response's token
ids (`prompt_ids`, `response_ids`; replay_step.py rebuilds the step's batch from them), and the behaviour
log-probs of its policy tokens (when recorded), an MoE policy's expert choices per token under routing replay
("experts": [tokens][sparse layers][k], prompt and response), each reward part
and the end reward, and the sampling parameters; with model judges their prompts and answers ("judges"); with a
teacher its log-prob of each policy token ("teacher_log_probs", teacher.py). `sources.json` says where rewards come from (reward functions,
the reward model's path and a digest of its weights, the reward server URLs and what their /health reports).
Files rotate every ROTATE steps (steps-000001.jsonl holds steps 1-100); on resume the rows after the checkpoint
are dropped, as metrics.jsonl's are, so a step's samples are written once. tools/replay_ledger.py reports on it.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import List, Optional

import numpy as np

from alignment.inputs import NUMBER, TEXT, check_keys, integer, json_lines

ROTATE = 100


def file_for(step: int) -> str:
    return f"steps-{(step - 1) // ROTATE * ROTATE + 1:06d}.jsonl"


def ledger_rows(step: int, rollout, ppo) -> List[dict]:
    """One row per sample of a scored rollout trained at step `step` (1-based, as metrics.jsonl); ppo: the
    PPOArguments whose sampling parameters each row records."""
    sampling = {"temperature": ppo.temperature, "top_p": ppo.top_p, "top_k": ppo.top_k,
                "repetition_penalty": ppo.repetition_penalty, "max_new_tokens": ppo.max_new_tokens}
    ids = rollout.input_ids.numpy()[:, rollout.prompt_len:]
    prompt_ids = rollout.input_ids.numpy()[:, :rollout.prompt_len]
    prompt_attention = rollout.attention_mask.numpy()[:, :rollout.prompt_len] > 0
    mask = rollout.response_mask.numpy() > 0
    attention = rollout.attention_mask.numpy()[:, rollout.prompt_len:] > 0
    per_token = {name: getattr(rollout, name).numpy() for name in ("behaviour_log_probs", "teacher_log_probs")
                 if getattr(rollout, name) is not None}  # [N, R] each
    token_versions = rollout.token_versions.numpy() if rollout.token_versions is not None else None
    experts = rollout.experts.numpy() if rollout.experts is not None else None  # [N, P + R, layers, k]
    end = rollout.end_rewards.numpy()
    rows = []
    for i in range(len(rollout)):
        parts = dict(rollout.reward_rows[i]) if rollout.reward_rows else {}
        judges = parts.pop("judges", None)  # model judges' prompts and answers (rewards/model_judges.py)
        row = {"step": step, "sample": rollout.sample_ids[i] if rollout.sample_ids else None,
               "prompt": rollout.prompts[i],
               "version": rollout.versions[i] if rollout.versions else step - 1,
               **({"weights_digest": rollout.weight_digests[i], "sampled_by": rollout.sampled_by[i]}
                  if rollout.weight_digests else {}),
               "prompt_ids": prompt_ids[i][prompt_attention[i]].tolist(),
               "response_ids": ids[i][attention[i]].tolist(),
               "policy_token": mask[i][attention[i]].astype(int).tolist(),
               "reward": float(end[i]), "reward_parts": parts, "sampling": sampling, **(
                   {"judges": judges} if judges else {})}
        for name, values in per_token.items():  # each policy token's
            row[name] = [float(x) for x in values[i][mask[i]]]
        if token_versions is not None:  # partial rollouts: the version of each policy token
            row["token_versions"] = token_versions[i][mask[i]].tolist()
        if experts is not None:  # MoE routing replay: each prompt and response token's experts, [layers][k] each
            row["experts"] = experts[i][np.concatenate([prompt_attention[i], attention[i]])].tolist()
        episode = rollout.episodes[i] if rollout.episodes else {}
        if "calls" in episode:  # an agent's episode: every gateway call, and the samples its edits dropped
            row.update(calls=episode["calls"], prefix_breaks=episode["prefix_breaks"],
                       agent_error=episode["agent_error"])
        rows.append(row)
    return rows


def dropped_rows(step: int, dropped, unused: List[str]) -> List[dict]:
    """Rows for the samples drawn for step `step` and not trained: dynamic sampling's (payload (rollout, end rewards
    [N], parts), rows, why) groups without reward spread or over its target, and the sample ids of prompt batches
    an asynchronous step never needed."""
    rows = []
    for (rollout, rewards, _), picked, why in dropped:
        values = rewards.numpy()
        rows += [{"step": step, "sample": rollout.sample_ids[i] if rollout.sample_ids else None, "dropped": why,
                  "reward": float(values[i])} for i in picked]
    return rows + [{"step": step, "sample": sample, "dropped": "not needed"} for sample in unused]


class Ledger:
    """Appends rows under <output_dir>/ledger/ (rank 0 only; the others pass enabled=False). A fresh run (no
    resume_at before its first write) starts the ledger anew: rows of an earlier run in the same output_dir
    (overwrite_output_dir) would read as samples trained twice."""

    def __init__(self, output_dir: str, enabled: bool, sources: Optional[dict] = None):
        self.folder = os.path.join(output_dir, "ledger")
        self.enabled, self.fresh = enabled, True
        if enabled:
            os.makedirs(self.folder, exist_ok=True)
            if sources is not None:
                with open(os.path.join(self.folder, "sources.json"), "w", encoding="utf-8") as f:
                    json.dump(sources, f, indent=2, sort_keys=True)

    def write(self, rows: List[dict]) -> None:
        if not self.enabled or not rows:
            return
        if self.fresh:
            self.resume_at(0)
        with open(os.path.join(self.folder, file_for(rows[0]["step"])), "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
            f.flush()
            os.fsync(f.fileno())

    def resume_at(self, step: int) -> None:
        """Drop the rows of steps after `step` (written by a run that stopped before its next checkpoint)."""
        self.fresh = False
        if not self.enabled:
            return
        for name in sorted(os.listdir(self.folder)):
            if not name.startswith("steps-"):
                continue
            path = os.path.join(self.folder, name)
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
            kept = [line for line in lines if line.strip() and _step_of(line) is not None and _step_of(line) <= step]
            if len(kept) != len(lines):
                with open(path, "w", encoding="utf-8") as f:
                    f.write("".join(kept))


def _step_of(line: str) -> Optional[int]:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a line cut by the kill: dropped


def file_digest(path: str) -> Optional[str]:
    """sha256 of a model directory's weight files (names and bytes), or None when it has none."""
    if not path or not os.path.isdir(path):
        return None
    digest = hashlib.sha256()
    names = sorted(n for n in os.listdir(path) if n.endswith((".safetensors", ".pdparams")))
    for name in names:
        digest.update(name.encode())
        with open(os.path.join(path, name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest() if names else None


def read_ledger(output_dir: str) -> List[dict]:
    """Every row of a run's ledger, in file order; ValueError naming a file and line that is not a row."""
    folder = os.path.join(output_dir, "ledger")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no ledger (set rollout_ledger: true, or run with rollout_ranks > 0)")
    rows = []
    for name in sorted(n for n in os.listdir(folder) if n.startswith("steps-")):
        path = os.path.join(folder, name)
        rows += [check_keys(row, ROW_KEYS, path, required=("step",), what="ledger row", line=line)
                 for line, row in json_lines(path, "ledger file")]
    return rows


ROW_KEYS = {"step": integer(0), "version": integer(), "sample": TEXT, "dropped": TEXT,
            "weights_digest": TEXT, "sampled_by": TEXT, "reward": NUMBER}  # NaN too: a row records what the run computed


def reward_sources(ppo, reward) -> dict:
    """Where the rewards come from, for sources.json: reward functions and weights, the reward model's path and
    weight digest, the reward server URLs and what their /health said."""
    model_path = getattr(getattr(reward, "model", None), "name_or_path", None)
    server = getattr(reward, "server", None)
    return {"reward_funcs": list(ppo.reward_funcs), "reward_weights": list(ppo.reward_weights),
            "reward_model": model_path, "reward_model_sha256": file_digest(model_path),
            "reward_server": list(getattr(server, "urls", []) or []),
            "reward_server_health": getattr(server, "health_report", None)}
