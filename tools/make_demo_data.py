#!/usr/bin/env python
"""Generate the small demo data sets under data/ (deterministic for a seed).

    python tools/make_demo_data.py            # rewrites data/ (seed 1234)
    python tools/make_demo_data.py --out /tmp/demo --seed 7

Every text is produced from the templates below (project-generated, CC0-1.0), sized
for a tiny model. Each *task family* returns a :class:`Task` (a prompt with a good and a
bad answer); the same tasks feed every output: SFT rows use the good answer, RL prompts
use the prompt, preference pairs and hh-rlhf transcripts use both. To extend, write a
new family ``fn(rng) -> Task`` and add it to the weights in ``SFT_MIX`` / ``PROMPT_MIX`` /
``PREFERENCE_MIX``. Eval/test prompts never occur in the matching train file.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from typing import Callable
import sys

if not __package__:  # run as a script from a checkout: make `alignment` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from alignment.commands.tool_parser import ToolParser  # noqa: E402

DEFAULT_SEED = 1234
NAMES = ["Tom", "Mia", "Sam", "Lena", "Omar", "Ana", "Ben", "Yuki", "Ravi", "Zoe", "Noah", "Ivy"]
ITEMS = ["apples", "pencils", "stickers", "books", "marbles", "cookies", "stamps", "shells"]
GOOD_NEWS = [  # (message, what to congratulate on)
    ("I finally finished my first painting", "your first painting"), ("I got a new puppy today", "your new puppy"),
    ("I passed my driving test", "passing your driving test"), ("I baked bread for the first time", "your first bread"),
    ("I started a new job this week", "your new job"), ("I ran three kilometres without stopping", "your run"),
    ("Our team won the match", "the win"), ("I planted tomatoes in my garden", "your tomato plants"),
    ("I learned to ride a bike", "learning to ride a bike"), ("I fixed my old bicycle", "fixing your bicycle"),
    ("I read a whole book this week", "finishing the book"), ("I got a good grade on my essay", "your good grade"),
    ("I am moving to a new flat", "your new flat"), ("I made a new friend at school", "your new friend"),
    ("My sister is visiting this weekend", "your sister's visit"), ("I cooked dinner for my family", "the dinner"),
    ("I sang in front of the class", "your song"), ("I cleaned the whole house", "the clean house"),
    ("I saved enough money for a trip", "saving for your trip"), ("I learned ten new words in Spanish", "your Spanish"),
]
NEWS_OPENERS = ["", "Guess what! ", "Good news: ", "Hi! "]
WARM_REPLIES = [
    "Congratulations on {what}! That is wonderful news, and you should be proud of yourself.",
    "How exciting! I am so happy for you and {what}. Enjoy every moment of it!",
    "That is great news! Well done on {what}, and thank you for sharing it with me.",
]
CURT_REPLIES = ["Whatever.", "So what? Nobody cares.", "Okay.", "That is not very impressive.",
                "I do not care about {what}."]
TIPS = {
    "sleeping well": ["Go to bed at the same time every night so your body learns a steady rhythm.",
                      "Keep your bedroom dark and quiet, and put your phone away an hour before bed."],
    "drinking enough water": ["Keep a bottle of water nearby and take a few sips every hour."],
    "studying for a test": ["Study in short sessions with breaks, and quiz yourself instead of only rereading."],
    "saving money": ["Write down what you spend each week so you can see where to cut back."],
    "keeping houseplants alive": ["Check the soil with your finger and water only when the top feels dry."],
    "staying focused": ["Work on one task at a time and silence notifications while you do it."],
    "making friends in a new city": ["Join a club or class about something you enjoy so you meet people regularly."],
    "cooking rice": ["Rinse the rice, use about two cups of water per cup of rice, and let it rest after cooking."],
    "exercising more": ["Start with a ten-minute walk each day and add a little more every week."],
    "learning a language": ["Practise a few minutes every day and say new words out loud."],
    "reducing stress": ["Take a few slow, deep breaths and then go for a short walk outside."],
    "keeping a tidy room": ["Put things back where they belong right after you use them."],
}
TIP_INSTRUCTIONS = ["Give a one-sentence helpful tip about {topic}.", "Share one short, practical tip for {topic}.",
                    "What is one good tip for {topic}? Answer in one sentence."]
UNHELPFUL_TIPS = ["I do not know. Figure it out yourself.", "Just do not bother with {topic}.", "Tips are pointless."]
REWRITES = [  # (negative template, positive template); {s} subject, {S} capitalised
    ("{S} is terrible.", "{S} is not my favourite, but it has some good parts."),
    ("I hate {s}.", "I am still learning to enjoy {s}."),
    ("{S} was a complete waste of time.", "{S} taught me something about what I enjoy."),
    ("Nothing about {s} ever goes right.", "{S} has had some bumps, and it can get better."),
    ("{S} is so boring.", "{S} is calm and gives me time to relax."),
]
SUBJECTS = ["the weather", "my job", "this movie", "the food", "our trip", "the meeting", "my garden", "the new phone"]
SAFETY = [  # (question, safe answer, unsafe answer)
    ("Is it okay to leave a candle burning when I go to sleep?",
     "No, blow the candle out before you sleep so it cannot start a fire.",
     "Yes, leave it burning all night, it will be fine."),
    ("Can I use my phone while driving if the road is empty?",
     "No, keep your eyes on the road and pull over safely if you need your phone.",
     "Sure, an empty road is safe enough for texting."),
    ("Should I wear a helmet for a short bike ride?",
     "Yes, wear a helmet on every ride, even a short one.",
     "No, helmets are only for long rides, so skip it."),
    ("Is it safe to swim alone in the sea at night?",
     "No, swim in daylight near a lifeguard or with a friend.",
     "Yes, the sea is calm at night, so swimming alone is fine."),
    ("A friend asked for my bank password. Should I share it?",
     "No, never share your password, not even with friends.",
     "Sure, just send it to them in a message."),
    ("Can I move a fallen power line off the road myself?",
     "No, stay far away and call the emergency number so trained workers can handle it.",
     "Yes, just push it aside with your hands."),
    ("I feel very sleepy. Is it fine to drive home anyway?",
     "It is safer to rest first or ask someone else to drive you home.",
     "Yes, open the window and drive fast to get home sooner."),
    ("Can I take double the medicine dose to feel better faster?",
     "No, take only the dose on the label and ask a pharmacist if it is not helping.",
     "Yes, a double dose works twice as fast."),
    ("Should I click a link in an email that says I won a prize?",
     "No, it is probably a scam, so delete the email instead.",
     "Yes, click it and enter your card details to claim the prize."),
    ("Is it okay to leave a toddler alone in the bath for a minute?",
     "No, always stay with a small child in the bath, even for a moment.",
     "Yes, a minute alone in the bath is no problem."),
    ("Can I cross the street on a red light if no cars are coming?",
     "It is safest to wait for the green light and look both ways.",
     "Yes, just run across whenever you like."),
    ("Do I need to test the smoke alarm in my home?",
     "Yes, test it once a month and change the battery when it beeps.",
     "No, smoke alarms never need testing."),
]
SAFETY_OPENERS = ["", "Quick question: ", "Please help. "]


@dataclass(frozen=True)
class Task:
    """A prompt (alpaca ``instruction`` + optional ``input``) with a good and a bad answer."""

    instruction: str
    input: str
    good: str
    bad: str
    bad_is_safe: bool = True

    @property
    def prompt(self) -> str:
        """The single-string prompt, joined like the alpaca loader joins instruction and input."""
        return f"{self.instruction}\n\n{self.input}" if self.input else self.instruction

    @property
    def chat_prompt(self) -> str:
        return f"{self.instruction}\n{self.input}" if self.input else self.instruction


# --------------------------------------------------------------------------- task families


def _wrong(rng: random.Random, value: int) -> int:
    return value + rng.choice([-3, -2, -1, 1, 2, 3, 10])


def arithmetic_task(rng: random.Random) -> Task:
    op = rng.choice("+-x")
    a, b = rng.randint(2, 20), rng.randint(2, 12 if op == "x" else 20)
    if op == "-" and b > a:
        a, b = b, a
    value = {"+": a + b, "-": a - b, "x": a * b}[op]
    return Task(f"What is {a} {op} {b}?", "", f"{a} {op} {b} = {value}.", f"{a} {op} {b} = {_wrong(rng, value)}.")


def word_problem_task(rng: random.Random) -> Task:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind, a, b = rng.choice(["add", "sub", "mul"]), rng.randint(3, 20), rng.randint(2, 9)
    if kind == "add":
        text, value = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", a + b
        good = f"{a} + {b} = {value}. {name} has {value} {item} now."
    elif kind == "sub":
        a += b
        text, value = f"{name} has {a} {item} and gives {b} away. How many {item} are left?", a - b
        good = f"{a} - {b} = {value}. {name} has {value} {item} left."
    else:
        text, value = f"{name} buys {b} bags with {a} {item} in each bag. How many {item} is that in total?", a * b
        good = f"{b} x {a} = {value}. That is {value} {item} in total."
    wrong = _wrong(rng, value)
    bad = good.replace(f"= {value}.", f"= {wrong}.").replace(f" {value} {item}", f" {wrong} {item}")
    return Task("Solve this word problem. Answer in one sentence.", text, good, bad)


def cheerful_task(rng: random.Random) -> Task:
    message, what = rng.choice(GOOD_NEWS)
    message = rng.choice(NEWS_OPENERS) + message + rng.choice(["!", "."])
    good = rng.choice(WARM_REPLIES).format(what=what)
    bad = rng.choice(CURT_REPLIES).format(what=what)
    return Task("Write a short cheerful reply to this message.", message, good, bad)


def tip_task(rng: random.Random) -> Task:
    topic = rng.choice(sorted(TIPS))
    bad = rng.choice(UNHELPFUL_TIPS).format(topic=topic)
    return Task(rng.choice(TIP_INSTRUCTIONS).format(topic=topic), "", rng.choice(TIPS[topic]), bad)


def rewrite_task(rng: random.Random) -> Task:
    (negative, positive), subject = rng.choice(REWRITES), rng.choice(SUBJECTS)
    fill = {"s": subject, "S": subject[0].upper() + subject[1:]}
    bad = rng.choice([negative.format(**fill), negative.format(**fill).replace(".", ", and everyone knows it.")])
    instruction = "Rewrite the sentence so it sounds positive and kind."
    return Task(instruction, negative.format(**fill), positive.format(**fill), bad)


def safety_task(rng: random.Random) -> Task:
    question, safe, unsafe = rng.choice(SAFETY)
    return Task(rng.choice(SAFETY_OPENERS) + question, "", safe, unsafe, bad_is_safe=False)


Family = Callable[[random.Random], Task]
SFT_MIX: list[tuple[Family, float]] = [(arithmetic_task, 0.25), (word_problem_task, 0.25), (cheerful_task, 0.15),
                                       (tip_task, 0.12), (rewrite_task, 0.13), (safety_task, 0.10)]
# RL prompts and preference pairs hold only open-ended tasks, the ones a learned reward model is for. Arithmetic
# pairs ("19 - 2 = 27." vs "19 - 2 = 17.") left a 135M reward model at chance (measured: 0.5 on them, while every
# other family scored 1.0), and PPO on that proxy broke right sums; verifiable tasks get rule rewards instead
# (reward_funcs, data/reasoning and config/smollm2/grpo_argument.json).
PROMPT_MIX: list[tuple[Family, float]] = [(cheerful_task, 0.45), (tip_task, 0.25), (rewrite_task, 0.3)]
PREFERENCE_MIX: list[tuple[Family, float]] = [(cheerful_task, 0.35), (tip_task, 0.25), (rewrite_task, 0.2),
                                              (safety_task, 0.2)]


def sample_tasks(rng: random.Random, mix: list[tuple[Family, float]], count: int, key: Callable[[Task], object],
                 banned_prompts: frozenset[str] = frozenset()) -> list[Task]:
    """``count`` tasks with distinct ``key``s whose prompts are not in ``banned_prompts``."""
    families, weights = zip(*mix)
    seen: set = set()
    tasks: list[Task] = []
    for _ in range(count * 200):
        task = rng.choices(families, weights)[0](rng)
        if key(task) not in seen and task.prompt not in banned_prompts:
            seen.add(key(task))
            tasks.append(task)
            if len(tasks) == count:
                return tasks
    raise RuntimeError(f"could only make {len(tasks)} distinct tasks of {count}; add templates")


def train_and_eval(rng: random.Random, mix: list[tuple[Family, float]], n_train: int, n_eval: int,
                   key: Callable[[Task], object]) -> tuple[list[Task], list[Task]]:
    """Eval tasks first; train tasks never reuse an eval prompt."""
    eval_tasks = sample_tasks(rng, mix, n_eval, key)
    banned = frozenset(task.prompt for task in eval_tasks)
    return sample_tasks(rng, mix, n_train, key, banned), eval_tasks


# --------------------------------------------------------------------------- rows


def sft_row(task: Task) -> dict:
    return {"instruction": task.instruction, "input": task.input, "output": task.good}


def prompt_row(task: Task) -> dict:
    return {"prompt": task.prompt}


def preference_row(task: Task, rng: random.Random) -> dict:
    assert task.good.strip() != task.bad.strip(), task
    good_id = rng.randint(0, 1)
    responses = [task.good, task.bad] if good_id == 0 else [task.bad, task.good]
    safe = [True, task.bad_is_safe] if good_id == 0 else [task.bad_is_safe, True]
    return {"prompt": task.prompt, "response_0": responses[0], "response_1": responses[1],
            "better_response_id": good_id, "safer_response_id": good_id,
            "is_response_0_safe": safe[0], "is_response_1_safe": safe[1]}


def _transcript(turns: list[str]) -> str:
    return "".join(f"\n\n{'Human' if i % 2 == 0 else 'Assistant'}: {turn}" for i, turn in enumerate(turns))


def hh_row(rng: random.Random, task: Task) -> dict:
    """Single-turn, or a second turn after an earlier exchange, or an arithmetic follow-up."""
    history: list[str] = []
    style = rng.choice(["single", "two_tasks", "follow_up"])
    if style == "two_tasks":
        first = rng.choice([cheerful_task, tip_task, arithmetic_task])(rng)
        history = [first.chat_prompt, first.good]
    elif style == "follow_up":
        opening = arithmetic_task(rng)
        total, extra = int(opening.good.split("= ")[1].rstrip(".")), rng.randint(2, 9)
        history = [opening.prompt, opening.good]
        task = Task(f"And if I add {extra} more?", "", f"{total} + {extra} = {total + extra}.",
                    f"{total} + {extra} = {_wrong(rng, total + extra)}.")
    return {"chosen": _transcript(history + [task.chat_prompt, task.good]),
            "rejected": _transcript(history + [task.chat_prompt, task.bad])}


def write_jsonl(path: str, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def build(seed: int) -> dict[str, list[dict]]:
    """Relative path -> rows, for every generated file."""
    rng = random.Random(seed)
    sft_train, sft_eval = train_and_eval(rng, SFT_MIX, 600, 60, key=lambda t: (t.prompt, t.good))
    prompts_train, prompts_eval = train_and_eval(rng, PROMPT_MIX, 160, 40, key=lambda t: t.prompt)
    pref_train, pref_test = train_and_eval(rng, PREFERENCE_MIX, 400, 60, key=lambda t: (t.prompt, t.good, t.bad))
    hh_tasks = sample_tasks(rng, PREFERENCE_MIX, 50, key=lambda t: t.prompt)
    return {
        "sft/train.jsonl": [sft_row(t) for t in sft_train],
        "sft/eval.jsonl": [sft_row(t) for t in sft_eval],
        "prompts/train.jsonl": [prompt_row(t) for t in prompts_train],
        "prompts/eval.jsonl": [prompt_row(t) for t in prompts_eval],
        "preference/train.jsonl": [preference_row(t, rng) for t in pref_train],
        "preference/test.jsonl": [preference_row(t, rng) for t in pref_test],
        "hh_rlhf_sample/train.jsonl": [hh_row(rng, t) for t in hh_tasks],
    }


def main(argv: list[str] | None = None) -> None:
    parser = ToolParser(__doc__)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args(argv)
    files = build(args.seed)
    for relative, rows in files.items():
        write_jsonl(os.path.join(args.out, relative), rows)
        print(f"{relative}: {len(rows)} rows")
    with open(os.path.join(args.out, "README.md"), "w", encoding="utf-8", newline="\n") as handle:
        handle.write(render_readme({name: len(rows) for name, rows in files.items()}, args.seed))




README = """# Demo data

Small, project-generated data sets for smoke tests and tiny-model runs of every stage.
All text comes from the templates in `tools/make_demo_data.py` (no third-party text).

**Licence:** CC0-1.0 (public-domain dedication), like the generator's templates.

**Made with:** `python tools/make_demo_data.py --seed {seed}` (deterministic: the same seed gives
byte-identical files; `tests/data/test_raw_data.py` checks the committed files match).
**Regenerate** after editing the generator with the same command, then commit `data/`.

Tasks are kept simple for a ~135M-parameter model: arithmetic (`What is 7 + 5?`), one-sentence word
problems, cheerful replies to good news, one-sentence tips, positive rewrites, and everyday-safety
questions. SFT data has them all; RL prompts (cheerful replies, tips, rewrites) and preference pairs (the same
plus safety) hold only the open-ended tasks a learned reward model is for: on arithmetic pairs a 135M reward
model stayed at chance, so verifiable tasks get rule rewards instead (`data/reasoning/`, GRPO).
Eval/test prompts never appear in the matching train file.

| file | rows | schema | dataset name |
| --- | ---: | --- | --- |
| `sft/train.jsonl` | {sft/train.jsonl} | alpaca: `instruction`, `input` (may be `""`), `output` | `alpaca` |
| `sft/eval.jsonl` | {sft/eval.jsonl} | same | `alpaca` |
| `prompts/train.jsonl` | {prompts/train.jsonl} | prompt-only: `prompt` | `prompt-only` |
| `prompts/eval.jsonl` | {prompts/eval.jsonl} | same | `prompt-only` |
| `preference/train.jsonl` | {preference/train.jsonl} | PKU-SafeRLHF (below) | `PKU-SafeRLHF/train` |
| `preference/test.jsonl` | {preference/test.jsonl} | same | `PKU-SafeRLHF/test` |
| `hh_rlhf_sample/train.jsonl` | {hh_rlhf_sample/train.jsonl} | hh-rlhf: `chosen`, `rejected` | `hh-rlhf` |

In argument files a dataset is `name:proportion:path`, e.g. `alpaca:1.0:data/sft/train.jsonl`,
`prompt-only:1.0:data/prompts/train.jsonl`, `PKU-SafeRLHF/train:1.0:data/preference` or
`hh-rlhf:1.0:data/hh_rlhf_sample`: a directory path loads the file named after the dataset's
split (`train`/`test`).

**PKU-SafeRLHF schema:** `prompt`, `response_0`, `response_1`, `better_response_id` (0/1),
`safer_response_id` (0/1), `is_response_0_safe`, `is_response_1_safe` (booleans). The better
response is clearly better (warm vs curt reply, real tip vs brush-off, positive vs still-negative
rewrite, safe vs unsafe advice) and its side (0/1) is random. Only the
everyday-safety pairs have an unsafe response; elsewhere both are safe and `safer_response_id`
equals `better_response_id`. The two responses are never identical.

**hh-rlhf schema:** `chosen` and `rejected` are whole transcripts
`"\\n\\nHuman: ...\\n\\nAssistant: ..."` that share every turn but the last assistant answer; some are
multi-turn (an earlier exchange, or an arithmetic follow-up such as `And if I add 3 more?`).

Prompts join instruction and input as `instruction + "\\n\\n" + input`, the way the `alpaca` loader
does, so SFT, RL and preference prompts look alike. Later stages may add model-sampled,
judge-labelled preference pairs: add a task family or a new file and document it here.

Model-sampled, judge-labelled pairs live in their own folders, each with a README giving the exact commands:
`judged/` (sampled from SmolLM2-135M-Instruct, for the SmolLM2 demo) and `judged_tiny/` (sampled from the tiny
pipeline's SFT model, for the tiny reward model).
"""


def render_readme(counts: dict[str, int], seed: int) -> str:
    text = README.replace("{seed}", str(seed))
    for name, count in counts.items():
        text = text.replace("{" + name + "}", str(count))
    return text


if __name__ == "__main__":
    main()
