"""Score a policy's greedy answers to held-out prompts with an offline gold judge, the way PPO's evaluation does.

    python tools/judge_policy.py --model outputs/smollm2-dpo/model [--prompts data/prompts/eval.jsonl]
        [--judge combined] [--max-length 160] [--max-new-tokens 32] [--batch-size 20] [--output answers.jsonl]

Several policies side by side (the main job's RL-vs-DPO table):

    python tools/judge_policy.py --model outputs/smollm2-sft/model outputs/smollm2-ppo/policy \
        outputs/smollm2-dpo/model --label SFT PPO DPO --wall-seconds - 408 495 --show 5

Multi-turn (the evaluation of a run with an `environment`): `--environment tools --environment-args
'{"tools": ["calculator"]}' --max-turns 4` plays each prompt's episode greedily, the judge scoring the final
assistant message, as run_ppo.py's evaluation does (`--env-modules` imports user environments).

Same prompts, same settings, same judge as `eval/gold_reward` in run_ppo.py (config/smollm2/ppo_argument.json:
greedy, batches of per_device_eval_batch_size = 20 in file order, each batch's new-token budget
min(max_new_tokens, max_length - its longest prompt)), so the numbers of SFT, DPO and PPO policies compare
directly. Prints the mean gold score; --output writes every prompt, answer and score as JSONL (with several
models, one row per prompt and model, with its `label`). With several models it prints a table of gold score, mean
answer length (words) and the wall time of its run given by --wall-seconds ("-": none), then the first --show
prompts with every model's answer and score.
"""
from __future__ import annotations

import dataclasses
import json
from typing import List, Optional, Tuple

from alignment.commands.tool_parser import ToolParser, non_negative_int, positive_int

from alignment.fileio import refuse_to_replace
from alignment.inputs import parse_json


def judge_policy(model_dir: str, prompts_spec: str, judge: str, max_length: int, max_new_tokens: int,
                 batch_size: int, env_args=None):
    """(mean gold score, rows) for the policy's greedy answers; with env_args (EnvironmentArguments naming an
    environment), its greedy episodes, max_new_tokens capping each turn."""
    import numpy as np
    from tqdm import tqdm

    from alignment.data import MixedRawDataset
    from alignment.data.tokenized import PromptOnlyDataset, collate_prompts
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer
    from alignment.rewards.functions import gold_scores
    from alignment.ppo.rollout.episodes import sample_episodes
    from alignment.ppo.rollout.rollout import sample_rollout

    tokenizer = Tokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir)
    prompts = PromptOnlyDataset(MixedRawDataset(prompts_spec, seed=0), tokenizer, max_length, too_long="error")
    base = GenerationConfig(max_new_tokens=1, do_sample=False, eos_token_id=model.config.eos_token_ids or
                            tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    rows = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="judging greedy answers", dynamic_ncols=True):
        items = [prompts[i] for i in range(start, min(start + batch_size, len(prompts)))]
        if env_args is not None:
            config = dataclasses.replace(base, max_new_tokens=min(max_length, max_new_tokens))
            rollout = sample_episodes(model, tokenizer, items, config, env_args, max_length)
        else:
            budget = max_length - max(len(item["input_ids"]) for item in items)
            config = dataclasses.replace(base, max_new_tokens=min(budget, max_new_tokens))
            rollout = sample_rollout(model, tokenizer, items, config, 1,
                                     lambda batch: collate_prompts(batch, tokenizer.pad_token_id))
        scores = gold_scores(judge, rollout.prompts, rollout.completions, rollout.labels)
        rows += [dict({"prompt": p, "completion": c, "gold_reward": float(s)}, **episode)
                 for p, c, s, episode in zip(rollout.prompts, rollout.completions, scores,
                                             rollout.episodes or [{}] * len(scores))]
    return float(np.mean([row["gold_reward"] for row in rows])), rows


def json_object(text: str) -> dict:
    value = parse_json(text, "--environment-args")  # its InputError is a ValueError: argparse names the flag
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def environment_arguments(args):
    """The run's EnvironmentArguments from the --environment flags (None without --environment), its user
    modules imported and one environment built, so a bad name or argument fails before any model loads."""
    if args.environment is None:
        return None
    from alignment.config.environment import EnvironmentArguments
    from alignment.envs import load_environment_modules
    from alignment.ppo.rollout.episodes import build_environments

    env_args = EnvironmentArguments(environment=args.environment, environment_args=args.environment_args,
                                    user_env_modules=args.env_modules, max_turns=args.max_turns,
                                    max_trajectory_tokens=args.max_trajectory_tokens)
    load_environment_modules(env_args.user_env_modules)
    build_environments(env_args, 1)
    return env_args


def words(text: str) -> int:
    return len(text.split())


def comparison_table(labels: List[str], results: List[Tuple[float, List[dict]]],
                     seconds: List[Optional[float]]) -> str:
    """Markdown table: one line per policy with its mean gold score, mean answer length and wall time."""
    lines = ["| policy | held-out gold | mean answer length (words) | wall time of its run |",
             "| --- | ---: | ---: | ---: |"]
    for label, (mean, rows), wall in zip(labels, results, seconds):
        length = sum(words(row["completion"]) for row in rows) / max(1, len(rows))
        time = "-" if wall is None else f"{int(wall) // 60} min {int(wall) % 60:02d} s"
        lines.append(f"| {label} | {mean:.4f} | {length:.1f} | {time} |")
    return "\n".join(lines)


def side_by_side(labels: List[str], results: List[Tuple[float, List[dict]]], count: int) -> str:
    """The first `count` prompts, each with every policy's answer and gold score."""
    out = []
    for i in range(min(count, len(results[0][1]))):
        out.append(f"prompt: {results[0][1][i]['prompt']!r}")
        for label, (_, rows) in zip(labels, results):
            out.append(f"  {label} ({rows[i]['gold_reward']:+.3f}): {rows[i]['completion']!r}")
    return "\n".join(out)


def _wall_seconds(values: Optional[List[str]], count: int, parser) -> List[Optional[float]]:
    if values is None:
        return [None] * count
    if len(values) != count:
        parser.error(f"--wall-seconds: {len(values)} values for {count} models")
    try:
        return [None if v == "-" else float(v) for v in values]
    except ValueError:
        parser.error(f"--wall-seconds: numbers of seconds or '-' expected, got {values}")


def main(argv=None) -> List[float]:
    p = ToolParser(__doc__)
    p.add_argument("--model", required=True, nargs="+", help="policy checkpoint directories (HF layout)")
    p.add_argument("--label", nargs="+", default=None, help="a name per model for the table (default: its path)")
    p.add_argument("--wall-seconds", nargs="+", default=None,
                   help="the wall time of each model's run, in seconds ('-': none), shown in the table")
    p.add_argument("--show", type=non_negative_int, default=0,
                   help="with several models: print this many prompts side by side")
    p.add_argument("--prompts", default="prompt-only:1.0:data/prompts/eval.jsonl", help="dataset spec or JSONL path")
    p.add_argument("--judge", default="combined", help="judge name (alignment/rewards/judges.py) or module:function")
    p.add_argument("--max-length", type=positive_int, default=160)
    p.add_argument("--max-new-tokens", type=positive_int, default=32)
    p.add_argument("--batch-size", type=positive_int, default=20)
    p.add_argument("--environment", default=None, help="play multi-turn episodes with this registered environment")
    p.add_argument("--environment-args", type=json_object, default={}, help="its constructor's arguments (JSON)")
    p.add_argument("--env-modules", nargs="+", default=[], help="files or modules defining user environments")
    p.add_argument("--max-turns", type=positive_int, default=4, help="assistant turns per episode")
    p.add_argument("--max-trajectory-tokens", type=positive_int, default=None,
                   help="tokens after the prompt per episode (default: what --max-length leaves)")
    p.add_argument("--output", default=None, help="write prompts, answers and scores here (JSONL)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    args = p.parse_args(argv)
    if args.output:
        refuse_to_replace(args.output, args.overwrite)
    labels = args.label or list(args.model)
    if len(labels) != len(args.model):
        p.error(f"--label: {len(labels)} labels for {len(args.model)} models")
    seconds = _wall_seconds(args.wall_seconds, len(args.model), p)
    spec = args.prompts if ":" in args.prompts else f"prompt-only:1.0:{args.prompts}"
    env_args = environment_arguments(args)
    results = []
    for model in args.model:
        results.append(judge_policy(model, spec, args.judge, args.max_length, args.max_new_tokens,
                                    args.batch_size, env_args))
        mean, rows = results[-1]
        print(f"{model}: gold reward ({args.judge}) {mean:.4f} on {len(rows)} prompts, greedy")
    if args.output:
        from alignment.fileio import write_text_atomic
        rows = [dict(row, label=label) if len(results) > 1 else row
                for label, (_, model_rows) in zip(labels, results) for row in model_rows]
        write_text_atomic(args.output, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    if len(results) > 1:
        print(f"\nheld-out gold reward ({args.judge}, greedy, {len(results[0][1])} prompts):\n")
        print(comparison_table(labels, results, seconds))
        if args.show > 0:
            print("\n" + side_by_side(labels, results, args.show))
    return [mean for mean, _ in results]

