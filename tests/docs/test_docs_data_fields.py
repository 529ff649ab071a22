"""The table of the fields each stage reads (docs/your-own/data.md) against the datasets the stages build: a row
with only the fields a stage's "needs" cell names (each alternative of it) is taken, and the same row without one of
them is refused in one line naming a field it lacks."""
import os
import re

import pytest

from alignment.data.raw import DataFormatError
from alignment.data.tokenized import PreferenceDataset, PromptOnlyDataset, SupervisedDataset
from alignment.dpo.data import UnpairedDataset
from alignment.models import Tokenizer
from tests.helpers import REPO

PAGE = os.path.join(REPO, "docs", "your-own", "data.md")
# the dataset each stage of the table tokenizes its rows with (alignment/sft/run_sft.py, rm/run_reward.py,
# dpo/stage.py, ppo/stage.py: the prompts of the PPO family and of distillation)
BUILDS = {"SFT": SupervisedDataset, "reward model": PreferenceDataset, "DPO family": PreferenceDataset,
          "KTO": UnpairedDataset, "PPO family": PromptOnlyDataset, "distillation": PromptOnlyDataset}
VALUES = {"input": "What is 2 + 2?", "answer": "It is 4.", "other_answer": "It is 5.", "desirable": False,
          "dialogue": ["What is 2 + 2?", "It is 4."],
          "messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "It is 4."}]}


def needs_cells():
    """{stage: [[fields of one alternative], ...]} from the first table's linked rows: its "needs" cell split at
    '; or', the backticked names outside parentheses."""
    with open(PAGE, encoding="utf-8") as f:
        table = f.read().split("## The fields each stage reads", 1)[1].split("\n\n")[1]
    found = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        stage = re.match(r"\[([^\]]+)\]", cells[0])
        if stage and stage.group(1) in BUILDS:
            alternatives = [re.sub(r"\([^)]*\)", "", part) for part in cells[1].split("; or")]
            found[stage.group(1)] = [re.findall(r"`(\w+)`", part) for part in alternatives]
    return found


NEEDS = needs_cells()


def test_the_table_names_every_stage_built_here():
    assert sorted(NEEDS) == sorted(BUILDS) and all(all(alt) for alts in NEEDS.values() for alt in alts)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("stage", sorted(BUILDS))
def test_the_fields_a_stage_needs_suffice_and_each_is_needed(stage, tok):
    for fields in NEEDS[stage]:
        row = {field: VALUES[field] for field in fields}
        assert len(BUILDS[stage]([row], tok, 128)) >= 1, (stage, fields)  # KTO makes two rows of a pair
        for missing in fields if len(NEEDS[stage]) == 1 or len(fields) > 1 else ():
            short = {field: value for field, value in row.items() if field != missing}
            with pytest.raises(DataFormatError, match=r"sample 0: no '\w+' field") as refused:
                BUILDS[stage]([short], tok, 128)
            named = re.search(r"no '(\w+)' field", str(refused.value)).group(1)
            # the field taken away, or (a KTO pair without `other_answer` reads as feedback) another that the
            # table names for the stage and the row lacks
            assert named == missing or (named not in short and any(named in alt for alt in NEEDS[stage])), named
