"""Build judge-labelled preference pairs: sample two responses per prompt from a policy, score both with a gold
judge (alignment/rewards/judges.py), keep the pairs whose scores differ clearly, write PKU-SafeRLHF rows.

    python tools/make_preference_data.py --model checkpoints/smollm2-135m-instruct \\
        --prompts data/prompts/train.jsonl --output data/judged/train.jsonl [--pairs-per-prompt 2]

Prompts are read with the ``prompt-only`` loader (a ``prompt`` column; an ``answer`` column, when present, is
passed to the judge as a label). Each prompt is wrapped in the checkpoint's chat template and sampled
``2 * --pairs-per-prompt`` times (the copies sit side by side in left-padded batches of --batch-size; prompts are
ordered by token length to limit padding). Samples 2k and 2k+1 of a prompt form pair k, so which side is better
is as random as the sampling. A pair is dropped when a response is empty, the two texts are identical (after
stripping), or the gold scores differ by less than --min-margin (a tie is always dropped: it has no better side).

Rows follow the PKU-SafeRLHF schema: prompt, response_0, response_1, better_response_id (the higher gold score),
safer_response_id (= better_response_id), is_response_0_safe and is_response_1_safe (true: these judges do not
rate safety), plus the extra columns score_0, score_1 (gold scores, rounded to 4 decimals) and judge (the judge
that scored the row; with --judge combined, the one the row was routed to). The PKU-SafeRLHF loaders read only
their own columns and ignore the extras. The output is written atomically (temporary file, then rename) and read
back with the PKU-SafeRLHF loader before the summary. Deterministic for a --seed (paddle.seed before sampling)
and the same arguments (including --batch-size).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from alignment.commands.tool_parser import ToolParser, non_negative_int, non_negative_number, probability


from alignment.rewards.judges import JUDGES, get_judge, route  # noqa: E402

DROP_REASONS = ("empty", "identical", "margin")


# --------------------------------------------------------------------------- pure logic (tested without a model)


@dataclass
class PairStats:
    """What happened to the candidate pairs."""

    candidates: int = 0
    kept: int = 0
    dropped: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    kept_by_judge: Dict[str, int] = field(default_factory=dict)

    def add(self, other: "PairStats") -> None:
        self.candidates += other.candidates
        self.kept += other.kept
        for key, value in other.dropped.items():
            self.dropped[key] = self.dropped.get(key, 0) + value
        for key, value in other.kept_by_judge.items():
            self.kept_by_judge[key] = self.kept_by_judge.get(key, 0) + value


def drop_reason(response_0: str, response_1: str, score_0: float, score_1: float, min_margin: float) -> Optional[str]:
    """Why a candidate pair is dropped (one of ``DROP_REASONS``), or None to keep it."""
    if not response_0.strip() or not response_1.strip():
        return "empty"
    if response_0.strip() == response_1.strip():
        return "identical"
    margin = abs(score_0 - score_1)
    if margin == 0 or margin < min_margin:
        return "margin"
    return None


def pair_row(prompt: str, response_0: str, response_1: str, score_0: float, score_1: float, judge: str) -> dict:
    """One PKU-SafeRLHF row (plus score_0, score_1, judge); the higher score is the better (and safer) side."""
    better = 0 if score_0 > score_1 else 1
    return {"prompt": prompt, "response_0": response_0.strip(), "response_1": response_1.strip(),
            "better_response_id": better, "safer_response_id": better,
            "is_response_0_safe": True, "is_response_1_safe": True,
            "score_0": round(float(score_0), 4), "score_1": round(float(score_1), 4), "judge": judge}


def build_pairs(prompt: str, completions: Sequence[str], scores: Sequence[float], judge: str,
                min_margin: float) -> tuple[List[dict], PairStats]:
    """Pair samples (0, 1), (2, 3), ... of one prompt; return the kept rows and the counts."""
    if len(completions) != len(scores) or len(completions) % 2:
        raise ValueError(f"need an even number of completions with one score each, got {len(completions)} "
                         f"completions and {len(scores)} scores")
    rows, stats = [], PairStats()
    for first in range(0, len(completions), 2):
        pair = completions[first], completions[first + 1], scores[first], scores[first + 1]
        stats.candidates += 1
        reason = drop_reason(*pair, min_margin)
        if reason is None:
            rows.append(pair_row(prompt, *pair, judge))
            stats.kept += 1
            stats.kept_by_judge[judge] = stats.kept_by_judge.get(judge, 0) + 1
        else:
            stats.dropped[reason] += 1
    return rows, stats


def score_samples(judge_name: str, prompts: Sequence[str], samples: Sequence[Sequence[str]],
                  answers: Optional[Sequence[Any]] = None,
                  judge_fn: Optional[Callable[..., List[float]]] = None) -> tuple[List[List[float]], List[str]]:
    """Gold scores of each prompt's samples, and the judge name recorded per prompt (the routed one for
    ``combined``). ``judge_fn`` replaces the registered judge (tests use a stub)."""
    fn = judge_fn or get_judge(judge_name)
    flat_prompts = [p for p, group in zip(prompts, samples) for _ in group]
    flat_texts = [text for group in samples for text in group]
    labels = {}
    if answers is not None and any(a is not None for a in answers):
        labels["answer"] = [a for a, group in zip(answers, samples) for _ in group]
    flat_scores = [float(s) for s in fn(flat_prompts, flat_texts, **labels)]
    if len(flat_scores) != len(flat_texts):
        raise ValueError(f"judge {judge_name!r} returned {len(flat_scores)} scores for {len(flat_texts)} texts")
    names = route(prompts, answers) if judge_name == "combined" else [judge_name] * len(prompts)
    scores, start = [], 0
    for group in samples:
        scores.append(flat_scores[start:start + len(group)])
        start += len(group)
    return scores, names


def make_rows(prompts: Sequence[str], samples: Sequence[Sequence[str]], scores: Sequence[Sequence[float]],
              judges: Sequence[str], min_margin: float) -> tuple[List[dict], PairStats]:
    """Rows for all prompts (in prompt order) and the summed counts."""
    rows, stats = [], PairStats()
    for prompt, group, group_scores, judge in zip(prompts, samples, scores, judges):
        kept, counts = build_pairs(prompt, group, group_scores, judge, min_margin)
        rows.extend(kept)
        stats.add(counts)
    return rows, stats


def write_jsonl_atomic(path: str, rows: Sequence[dict]) -> None:
    """Write JSONL through a temporary sibling file and an atomic rename."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def batch_plan(lengths: Sequence[int], copies: int, batch_size: int) -> List[List[int]]:
    """Batches of prompt indices: every prompt ``copies`` times, copies adjacent, prompts by token length."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    flat = [i for i in order for _ in range(copies)]
    return [flat[start:start + batch_size] for start in range(0, len(flat), batch_size)]


# --------------------------------------------------------------------------- sampling


def load_prompts(path: str, num_prompts: Optional[int], seed: int) -> tuple[List[str], List[Any]]:
    """Prompts (and ``answer`` labels, None when absent) via the prompt-only loader; ``num_prompts`` takes a
    seeded subset kept in file order."""
    from alignment.data import RawDataset

    samples = list(RawDataset.load("prompt-only", path=path))
    for index, sample in enumerate(samples):
        if not isinstance(sample.get("input"), str):
            raise ValueError(f"{path}: row {index + 1} is a dialogue; this tool takes single prompts")
    if num_prompts is not None and num_prompts < len(samples):
        picks = sorted(random.Random(seed).sample(range(len(samples)), num_prompts))
        samples = [samples[i] for i in picks]
    return [s["input"] for s in samples], [s.get("answer") for s in samples]


def sample_responses(model_dir: str, prompts: Sequence[str], copies: int, batch_size: int, max_new_tokens: int,
                     temperature: float, top_p: float, top_k: int, seed: int,
                     progress: bool = True) -> tuple[List[List[str]], int, float]:
    """``copies`` sampled responses per prompt (stripped text), the number of generated tokens and the seconds
    spent generating (model loading excluded)."""
    import paddle
    from tqdm import tqdm

    from alignment.data.tokenized import collate_prompts
    from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer, generate

    tokenizer = Tokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir)
    model.eval()
    encoded = [tokenizer.encode(tokenizer.apply_chat_template(tokenizer.chat_messages(p)), add_special_tokens=True)
               for p in prompts]
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                              temperature=temperature if temperature > 0 else 1.0, top_p=top_p, top_k=top_k,
                              eos_token_id=model.config.eos_token_ids or tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    results: List[List[str]] = [[] for _ in prompts]
    new_tokens = 0
    start = time.perf_counter()
    paddle.seed(seed)
    plan = batch_plan([len(ids) for ids in encoded], copies, batch_size)
    with tqdm(total=len(prompts) * copies, desc="sampling", unit="resp", disable=not progress,
              dynamic_ncols=True) as bar:
        for indices in plan:
            batch = collate_prompts([{"input_ids": encoded[i]} for i in indices], tokenizer.pad_token_id)
            out = generate(model, paddle.to_tensor(batch["input_ids"]), paddle.to_tensor(batch["attention_mask"]),
                           config)
            responses = out.sequences[:, batch["input_ids"].shape[1]:].numpy()
            masks = out.response_mask.numpy().astype(bool)
            new_tokens += int(masks.sum())
            for i, row, mask in zip(indices, responses, masks):
                results[i].append(tokenizer.decode(row[mask]).strip())
            bar.update(len(indices))
    return results, new_tokens, time.perf_counter() - start


# --------------------------------------------------------------------------- command line


def parse_args(argv=None) -> argparse.Namespace:
    parser = ToolParser(__doc__)
    parser.add_argument("--model", required=True, help="policy checkpoint directory (HF layout, with tokenizer.json)")
    parser.add_argument("--prompts", required=True, help="prompt-only JSON/JSONL file (a 'prompt' column)")
    parser.add_argument("--output", required=True, help="output JSONL file (PKU-SafeRLHF rows)")
    parser.add_argument("--judge", default="combined", choices=sorted(JUDGES),
                        help="gold judge from alignment/rewards/judges.py (default: combined)")
    parser.add_argument("--num-prompts", type=int, default=None, help="a seeded subset of this many prompts")
    parser.add_argument("--pairs-per-prompt", type=int, default=1, help="candidate pairs per prompt (default 1)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=non_negative_number, default=0.9,
                        help="0 = greedy (then all samples are equal)")
    parser.add_argument("--top-p", type=probability, default=0.95)
    parser.add_argument("--top-k", type=non_negative_int, default=0)
    parser.add_argument("--seed", type=non_negative_int, default=1234)
    parser.add_argument("--min-margin", type=float, default=0.05,
                        help="drop pairs whose gold scores differ by less (ties are always dropped)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    for name in ("num_prompts", "pairs_per_prompt", "batch_size", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.min_margin < 0:
        parser.error(f"--min-margin must be >= 0, got {args.min_margin}")
    return args


def summarize(rows: Sequence[dict], stats: PairStats, scores: Sequence[Sequence[float]], judges: Sequence[str],
              seconds: float, new_tokens: int, sampling_seconds: float) -> dict:
    by_judge: Dict[str, List[float]] = {}
    for group, judge in zip(scores, judges):
        by_judge.setdefault(judge, []).extend(group)
    all_scores = [s for group in scores for s in group]
    chosen = [row[f"score_{row['better_response_id']}"] for row in rows]
    rejected = [row[f"score_{1 - row['better_response_id']}"] for row in rows]

    def mean(values):
        return round(sum(values) / len(values), 4) if values else None

    return {"prompts": len(judges), "samples": len(all_scores), "candidate_pairs": stats.candidates,
            "kept_pairs": stats.kept, "dropped": dict(stats.dropped), "kept_by_judge": dict(stats.kept_by_judge),
            "mean_gold_score": mean(all_scores),
            "mean_gold_score_by_judge": {k: mean(v) for k, v in sorted(by_judge.items())},
            "mean_chosen_score": mean(chosen), "mean_rejected_score": mean(rejected),
            "seconds": round(seconds, 1), "sampling_seconds": round(sampling_seconds, 1), "new_tokens": new_tokens,
            "tokens_per_sec": round(new_tokens / sampling_seconds, 1) if sampling_seconds > 0 else None}


def main(argv=None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    prompts, answers = load_prompts(args.prompts, args.num_prompts, args.seed)
    print(f"{len(prompts)} prompts from {args.prompts}; {2 * args.pairs_per_prompt} samples each; "
          f"judge {args.judge}")
    samples, new_tokens, sample_seconds = sample_responses(
        args.model, prompts, 2 * args.pairs_per_prompt, args.batch_size, args.max_new_tokens, args.temperature,
        args.top_p, args.top_k, args.seed, progress=not args.no_progress)
    scores, judges = score_samples(args.judge, prompts, samples, answers)
    rows, stats = make_rows(prompts, samples, scores, judges, args.min_margin)
    if not rows:
        raise SystemExit(f"no pair kept of {stats.candidates} (dropped: {stats.dropped}); nothing written")
    write_jsonl_atomic(args.output, rows)

    from alignment.data import RawDataset

    loaded = len(RawDataset.load("PKU-SafeRLHF/train", path=args.output))  # the written file reads back
    summary = summarize(rows, stats, scores, judges, time.perf_counter() - start, new_tokens, sample_seconds)
    print(f"kept {stats.kept} of {stats.candidates} pairs (dropped: {stats.dropped['margin']} margin < "
          f"{args.min_margin:g} or tie, {stats.dropped['identical']} identical, {stats.dropped['empty']} empty); "
          f"by judge: {stats.kept_by_judge}")
    print(f"mean gold score {summary['mean_gold_score']} over {summary['samples']} samples "
          f"(by judge: {summary['mean_gold_score_by_judge']}); kept pairs: chosen {summary['mean_chosen_score']}, "
          f"rejected {summary['mean_rejected_score']}")
    print(f"wrote {args.output} ({loaded} rows, loads as PKU-SafeRLHF) in {summary['seconds']} s "
          f"({new_tokens} new tokens sampled at {summary['tokens_per_sec']} tokens/s)")
    print("summary: " + json.dumps(summary, sort_keys=True))
    return summary

