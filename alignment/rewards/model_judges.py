"""Language-model judges as reward functions: `reward_funcs: ["judge:path/to/judge.yaml"]`. The file (JSON or
YAML, plain data) says who judges and how its answer is read:

    model: outputs/tiny-sft/model      # a local causal LM (its chat template), or
    endpoint: http://127.0.0.1:8000/v1 # an OpenAI-compatible server: POST {endpoint}/chat/completions
    served_model: judge                # the endpoint's model name (default: the first its /models lists)
    rubric: Is the reply cheerful and helpful?
    parser: number                     # judge_parsers.py: number, yes_no, letter; ranking (group: true)
    range: [0, 10]                     # the number parser's range
    group: false                       # true: all answers to one prompt in one judge prompt, ranked (RULER)
    template: null                     # null: the default; else text with {rubric} {prompt} {answer}
                                       # {reference} ({answers} for a group) {instruction}
    max_tokens: 16, temperature: 0.0, retries: 3, timeout: 60.0

The reference is the row's `answer` column when it has one. Scores are in [0, 1] (the parser's), cached per
(prompt, answer, reference) - per group for a ranking judge - for the run. An answer the parser cannot read is asked
again, `retries` times; an endpoint's failures are retried as the reward server's (remote.py); past that the step
stops with one line naming the judge (JudgeError, a RewardServerError). Each call's judge prompts and answers are
kept (`transcripts`, per completion) for the rollout ledger.
"""
from __future__ import annotations

import os
import string
from typing import Dict, List, Optional, Sequence, Tuple

from alignment.config.argument_file import load_argument_file
from alignment.config.registry import JUDGE_PARSERS
from alignment.rewards.judge_parsers import Unparseable  # (importing it registers the built-in parsers)
from alignment.rewards.openai_client import OpenAIEndpoint
from alignment.rewards.remote import RewardServerError, one_line

PREFIX = "judge:"
SINGLE = ("You are a careful judge. {rubric}\n\nQuestion:\n{prompt}\n\nAnswer:\n{answer}\n{reference}\n{instruction}")
GROUP = ("You are a careful judge. {rubric}\n\nQuestion:\n{prompt}\n\n{answers}\n{reference}\n{instruction}")
KEYS = {"model", "endpoint", "served_model", "rubric", "parser", "range", "group", "template", "max_tokens",
        "temperature", "retries", "timeout", "token"}
FIELDS = {False: {"rubric", "prompt", "answer", "reference", "instruction"},
          True: {"rubric", "prompt", "answers", "reference", "instruction"}}


class JudgeError(RewardServerError):
    """A judge gave no score past its retries: unreachable, failing, or answers its parser cannot read."""


def load_judge_options(path: str) -> dict:
    """The judge file's options, checked (ValueError naming the file and key), with their defaults."""
    where = f"key 'reward_funcs': judge file {path}"
    if not os.path.isfile(path):
        raise ValueError(f"{where}: no such file")
    options = load_argument_file(path)
    unknown = sorted(set(options) - KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(KEYS)}")
    if bool(options.get("model")) == bool(options.get("endpoint")):
        raise ValueError(f"{where}: set exactly one of 'model' (a local causal LM) and 'endpoint' (a server's URL)")
    out = {"rubric": "", "parser": "number", "range": [0, 10], "group": False, "template": None, "max_tokens": 16,
           "temperature": 0.0, "retries": 3, "timeout": 60.0, "served_model": None, "token": None, **options}
    group = bool(out["group"])
    names = JUDGE_PARSERS.names(where=lambda cls: cls.group == group)
    if out["parser"] not in names:
        raise ValueError(f"{where}: 'parser' must be one of {names} with 'group' {str(group).lower()}, got "
                         f"{out['parser']!r}")
    low, high = (out["range"] + [None, None])[:2] if isinstance(out["range"], list) else (None, None)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)) or low >= high:
        raise ValueError(f"{where}: 'range' must be [low, high] numbers with low < high, got {out['range']!r}")
    for key, smallest in (("max_tokens", 1), ("retries", 0), ("timeout", 1e-9), ("temperature", 0.0)):
        if isinstance(out[key], bool) or not isinstance(out[key], (int, float)) or out[key] < smallest:
            raise ValueError(f"{where}: {key!r} must be a number >= {smallest:g}, got {out[key]!r}")
    template = out["template"] or (GROUP if group else SINGLE)
    used = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    if used - FIELDS[group]:
        raise ValueError(f"{where}: 'template' uses {sorted(used - FIELDS[group])}; it may use {sorted(FIELDS[group])}")
    out["template"] = template
    return out


class ModelJudge:
    """A reward function (functions.py's signature) asking a language model. spec: the reward_funcs entry."""

    def __init__(self, spec: str):
        self.spec, self.path = spec, spec[len(PREFIX):]
        self.options = load_judge_options(self.path)
        self.parser = JUDGE_PARSERS[self.options["parser"]]()
        self.name = f"judge {self.path!r}"
        self.cache: Dict[tuple, Tuple[object, str, str]] = {}  # key -> (score(s), judge prompt, its answer)
        self.backend = None  # made on first use: a local model loads only when the judge is first asked
        self.transcripts: List[dict] = []

    def make_backend(self):
        opts = self.options
        if opts.get("endpoint"):
            from alignment.config.ppo import server_urls

            return OpenAIEndpoint(server_urls(opts["endpoint"]), self.name, (
                f"endpoint of {self.path}", f"retries of {self.path}", f"timeout of {self.path}"), "JUDGE_TOKEN",
                opts["served_model"], opts["token"], opts["timeout"], opts["retries"])
        from alignment.rewards.judge_backends import LocalJudgeModel

        return LocalJudgeModel(opts["model"])

    def render(self, prompt: str, answers: Sequence[str], reference) -> str:
        opts = self.options
        low, high = opts["range"]
        fields = {"rubric": opts["rubric"], "prompt": prompt, "reference": (
            f"Reference answer:\n{reference}\n" if reference not in (None, "") else ""),
            "instruction": self.parser.instruction.format(low=f"{low:g}", high=f"{high:g}")}
        if self.parser.group:
            fields["answers"] = "\n\n".join(f"Answer {i + 1}:\n{a}" for i, a in enumerate(answers))
        else:
            fields["answer"] = answers[0]
        return opts["template"].format(**fields)

    def ask(self, judge_prompts: List[str]) -> List[Tuple[str, Optional[dict]]]:
        """(answer text, [(first-token candidate, log-prob)] or None) of each judge prompt."""
        if self.backend is None:
            self.backend = self.make_backend()
        top = 20 if self.parser.needs_top_logprobs else 0
        opts = self.options
        if isinstance(self.backend, OpenAIEndpoint):
            try:
                return [self.backend.chat([{"role": "user", "content": text}], opts["max_tokens"],
                                          opts["temperature"], top)[0] for text in judge_prompts]
            except RewardServerError as err:  # unreachable or failing past its retries
                raise JudgeError(str(err)) from None
        return self.backend.answer(judge_prompts, opts["max_tokens"], self.parser.candidates, opts["temperature"])

    def read(self, text: str, top, size: int):
        return self.parser.rank(text, size, self.options) if self.parser.group else self.parser(text, top,
                                                                                               self.options)

    def judged(self, keys: List[tuple]) -> None:
        """Fill the cache for `keys` (prompt, answers, reference) not in it: ask, read, ask again what is unread."""
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))
        reasons: Dict[tuple, str] = {}
        for _ in range(self.options["retries"] + 1):
            if not todo:
                return
            prompts = [self.render(k[0], k[1], k[2]) for k in todo]
            unread = []
            for key, judge_prompt, (text, top) in zip(todo, prompts, self.ask(prompts)):
                try:
                    self.cache[key] = (self.read(text, top, len(key[1])), judge_prompt, text)
                except Unparseable as err:
                    reasons[key] = f"{err}; it answered {one_line(text, 80)!r}"
                    unread.append(key)
            todo = unread
        if todo:
            raise JudgeError(f"{self.name}: no score after {self.options['retries'] + 1} attempts (its 'retries'): "
                             f"{reasons[todo[0]]} (question {one_line(todo[0][0], 60)!r})")

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], answer=None, **labels) -> List[float]:
        references = list(answer) if answer is not None else [None] * len(prompts)
        if self.parser.group:  # consecutive rows with one prompt are its group (num_return_sequences)
            spans, start = [], 0
            for i in range(1, len(prompts) + 1):
                if i == len(prompts) or prompts[i] != prompts[start]:
                    spans.append((start, i))
                    start = i
            keys = [(prompts[a], tuple(completions[a:b]), references[a]) for a, b in spans]
            rows = [(key, j) for key, (a, b) in zip(keys, spans) for j in range(b - a)]
        else:
            keys = [(p, (c,), r) for p, c, r in zip(prompts, completions, references)]
            rows = [(key, 0) for key in keys]
        self.judged(keys)
        self.transcripts = [{"prompt": self.cache[key][1], "answer": self.cache[key][2]} for key, _ in rows]
        if self.parser.group:
            return [float(self.cache[key][0][j]) for key, j in rows]
        return [float(self.cache[key][0]) for key, _ in rows]


def load_model_judge(spec: str) -> ModelJudge:
    return ModelJudge(spec)
