"""Rule rewards for verifiable tasks (reasoning-gym style prompts that ask for <answer></answer> tags).

accuracy: 1.0 when the completion's answer equals the `answer` label, else 0.0. The answer is the content of the
          last <answer>...</answer> block, or, without tags, the last number in the text. Numbers compare as
          numbers (within 1e-6), anything else as whitespace-stripped text.
format:   1.0 when the completion is an optional <think>...</think> block followed by exactly one
          <answer>...</answer> block and nothing else (MindRLHF / DeepSeek-R1 style), 0.5 when it contains exactly
          one <answer> block among other text, else 0.0.
An empty block (`<answer></answer>`, `<answer> </answer>`) is not an answer for either reward: GRPO on SmolLM2
learned to echo the prompt's literal "<answer></answer>" tags with a number after them ("The final number inside
<answer></answer> is 1.") for the format credit, and accuracy then read the empty block.
gsm8k:    PaddleNLP's rule reward (`use_rule_reward: true`; paddlenlp/rl/trainer/reward_trainer.py compute_score,
          method "strict", after ReFT): 1.0 when the number after the last "#### " equals the `answer` label as
          text (commas removed from the completion's number, as PaddleNLP does), 0.0 when it differs or there is
          no "#### N" (PaddleNLP's format_score and its no-answer score are both 0). The label is the number, as
          PaddleNLP's gsm8k_processor.py writes `tgt`, or a GSM8K solution whose own "#### N" gives it.
All have the reward-function signature fn(prompts, completions, **labels) -> list[float], and are registered
reward functions under these names (alignment/config/registry.py REWARD_FUNCTIONS).
"""
from __future__ import annotations

import re
from typing import Any, List, Optional, Sequence

from alignment.config.registry import REWARD_FUNCTIONS

ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
STRICT_FORMAT = re.compile(r"^\s*(<think>.*?</think>\s*)?<answer>(?:(?!<answer>).)*?</answer>\s*$", re.DOTALL)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")  # PaddleNLP's reward_utils.extract_solution, "strict"


def answer_blocks(completion: str) -> List[str]:
    """The stripped contents of the completion's non-empty <answer> blocks, in order."""
    return [block.strip() for block in ANSWER_BLOCK.findall(completion) if block.strip()]


def extract_answer(completion: str) -> Optional[str]:
    blocks = answer_blocks(completion)
    if blocks:
        return blocks[-1]
    numbers = NUMBER.findall(completion.replace(",", ""))
    return numbers[-1] if numbers else None


def answers_match(predicted: Optional[str], expected: Any) -> bool:
    if predicted is None or expected is None:
        return False
    expected = str(expected).strip()
    try:
        return abs(float(predicted.replace(",", "")) - float(expected)) < 1e-6
    except ValueError:
        return predicted.strip() == expected


@REWARD_FUNCTIONS.function("accuracy")
def accuracy(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[Any] = None,
             **labels: Any) -> List[float]:
    if answer is None:
        raise ValueError("the 'accuracy' reward needs an 'answer' column in the prompt dataset")
    return [float(answers_match(extract_answer(c), a)) for c, a in zip(completions, answer)]


@REWARD_FUNCTIONS.function("format_reward")
def format_reward(prompts: Sequence[str], completions: Sequence[str], **labels: Any) -> List[float]:
    scores = []
    for completion in completions:
        blocks = ANSWER_BLOCK.findall(completion)
        one_answer = len(blocks) == 1 and bool(blocks[0].strip())
        if one_answer and STRICT_FORMAT.match(completion):
            scores.append(1.0)
        elif one_answer:
            scores.append(0.5)
        else:
            scores.append(0.0)
    return scores


def gsm8k_answer(text: str) -> Optional[str]:
    """The number after the last "#### " (commas and "$" removed), or None: PaddleNLP's strict extraction."""
    found = GSM8K_ANSWER.findall(text)
    return found[-1].replace(",", "").replace("$", "") if found else None


@REWARD_FUNCTIONS.function("gsm8k")
def gsm8k(prompts: Sequence[str], completions: Sequence[str], answer: Sequence[Any] = None,
          **labels: Any) -> List[float]:
    if answer is None:
        raise ValueError("the 'gsm8k' rule reward needs an 'answer' column in the prompt dataset (PaddleNLP's 'tgt')")
    truths = [gsm8k_answer(str(a)) or str(a).strip() for a in answer]
    return [float(gsm8k_answer(c) is not None and gsm8k_answer(c) == t) for c, t in zip(completions, truths)]
