"""tools/make_tiny.py's tokenizer corpus, and the tiny reward model's pairs (data/judged_tiny) it must not see."""
import json
import os

from alignment.data import RawDataset
from tests.helpers import REPO
from alignment.commands import make_tiny


def test_the_tokenizer_corpus_leaves_out_text_the_tiny_model_sampled(tmp_path):
    for rel in ("sft/train.jsonl", "judged_tiny/train.jsonl", "judged/train.jsonl"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"prompt": rel}) + "\n")
    files = make_tiny.corpus_files(str(tmp_path))
    assert [os.path.relpath(f, tmp_path) for f in files] == ["judged/train.jsonl", "sft/train.jsonl"]
    before = make_tiny.recipe_hash(files)
    (tmp_path / "judged_tiny" / "train.jsonl").write_text(json.dumps({"prompt": "resampled"}) + "\n")
    assert make_tiny.recipe_hash(make_tiny.corpus_files(str(tmp_path))) == before  # same tokenizer, same SFT model


def test_the_shipped_tiny_pairs_load_and_the_better_side_has_the_higher_gold_score():
    path = os.path.join(REPO, "data", "judged_tiny")
    for split, rows in (("train", 918), ("test", 111)):
        samples = list(RawDataset.load(f"PKU-SafeRLHF/{split}", path=path))
        assert len(samples) == rows
        with open(os.path.join(path, f"{split}.jsonl"), encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                better, worse = row[f"score_{row['better_response_id']}"], row[f"score_{1 - row['better_response_id']}"]
                assert better - worse >= 0.05 and row["judge"] == "sentiment"
