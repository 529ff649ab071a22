"""Score a policy's greedy answers to held-out prompts with an offline gold judge, the way PPO's evaluation does.

    python tools/judge_policy.py --model outputs/smollm2-dpo/model [--prompts data/prompts/eval.jsonl]
        [--judge combined] [--max-length 160] [--max-new-tokens 32] [--batch-size 20] [--output answers.jsonl]

Same prompts, same settings, same judge as `eval/gold_reward` in run_ppo.py (config/smollm2/ppo_argument.json:
greedy, batches of per_device_eval_batch_size = 20 in file order, each batch's new-token budget
min(max_new_tokens, max_length - its longest prompt)), so the numbers of SFT, DPO and PPO policies compare
directly. Prints the mean gold score; --output writes every prompt, answer and score as JSONL.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.config.tool_parser import ToolParser  # noqa: E402

from alignment.cpu_env import apply_cpu_defaults  # noqa: E402

apply_cpu_defaults()  # this CPU's thread and MKL settings, before paddle is imported


def judge_policy(model_dir: str, prompts_spec: str, judge: str, max_length: int, max_new_tokens: int,
                 batch_size: int):
    """(mean gold score, rows) for the policy's greedy answers."""
    import numpy as np
    from tqdm import tqdm

    from alignment.data import MixedRawDataset
    from alignment.data.tokenized import PromptOnlyDataset, collate_prompts
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer
    from alignment.rewards.functions import gold_scores
    from alignment.ppo.rollout import sample_rollout

    tokenizer = Tokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir)
    prompts = PromptOnlyDataset(MixedRawDataset(prompts_spec, seed=0), tokenizer, max_length, too_long="error")
    base = GenerationConfig(max_new_tokens=1, do_sample=False, eos_token_id=model.config.eos_token_ids or
                            tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    rows = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="judging greedy answers", dynamic_ncols=True):
        items = [prompts[i] for i in range(start, min(start + batch_size, len(prompts)))]
        budget = max_length - max(len(item["input_ids"]) for item in items)
        config = dataclasses.replace(base, max_new_tokens=min(budget, max_new_tokens))
        rollout = sample_rollout(model, tokenizer, items, config, 1,
                                 lambda batch: collate_prompts(batch, tokenizer.pad_token_id))
        scores = gold_scores(judge, rollout.prompts, rollout.completions, rollout.labels)
        rows += [{"prompt": p, "completion": c, "gold_reward": float(s)}
                 for p, c, s in zip(rollout.prompts, rollout.completions, scores)]
    return float(np.mean([row["gold_reward"] for row in rows])), rows


def main(argv=None) -> float:
    p = ToolParser(__doc__)
    p.add_argument("--model", required=True, help="policy checkpoint directory (HF layout)")
    p.add_argument("--prompts", default="prompt-only:1.0:data/prompts/eval.jsonl", help="dataset spec or JSONL path")
    p.add_argument("--judge", default="combined", help="judge name (alignment/rewards/judges.py) or module:function")
    p.add_argument("--max-length", type=int, default=160)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--output", default=None, help="write prompts, answers and scores here (JSONL)")
    args = p.parse_args(argv)
    spec = args.prompts if ":" in args.prompts else f"prompt-only:1.0:{args.prompts}"
    mean, rows = judge_policy(args.model, spec, args.judge, args.max_length, args.max_new_tokens, args.batch_size)
    if args.output:
        from alignment.fileio import write_text_atomic
        write_text_atomic(args.output, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    print(f"{args.model}: gold reward ({args.judge}) {mean:.4f} on {len(rows)} prompts, greedy")
    return mean


if __name__ == "__main__":
    main()
