"""Language-model judges as rewards (alignment/rewards/model_judges.py, judge_parsers.py, judge_backends.py): the
parsers by hand, the judge file's errors, an OpenAI-compatible endpoint (tests/served_teacher.py's app answering
chat completions as scripted), retries, the cache, group ranking, a local model judge, and a GRPO run whose reward
is a judge (its prompts and answers in the ledger; its endpoint down stops the run naming it)."""
import json
import os

import numpy as np
import pytest

from alignment.config.registry import JUDGE_PARSERS
from alignment.rewards.functions import load_reward_function
from alignment.rewards.judge_parsers import JudgeParser, Unparseable
from alignment.rewards.model_judges import JudgeError, ModelJudge
from tests.helpers import REPO, read_metrics
from tests.served_teacher import Served, make_app

OPTIONS = {"range": [1, 5]}


def parse(name, text, top=None, n=None):
    parser = JUDGE_PARSERS[name]()
    return parser.rank(text, n, OPTIONS) if n is not None else parser(text, top, OPTIONS)


def test_parsers_by_hand():
    assert parse("number", "Score: 4 of 5") == 0.75  # (4 - 1) / (5 - 1), the first number
    assert parse("number", "1") == 0.0 and parse("number", "5.0") == 1.0
    assert parse("yes_no", "", top=[(" Yes", np.log(0.6)), ("no", np.log(0.2)), ("yes", np.log(0.1))]) == \
        pytest.approx(0.7 / 0.9)
    assert parse("yes_no", "Yes, it is.", top=[("maybe", -0.1)]) == 1.0 and parse("yes_no", "no") == 0.0
    assert parse("letter", "Grade: B+") == 0.75 and parse("letter", "F") == 0.0
    assert parse("ranking", "3 > 1 > 2", n=3) == [0.5, 0.0, 1.0]
    assert parse("ranking", "Answer 2 is best, then answer 1", n=2) == [0.0, 1.0]
    assert parse("ranking", "anything", n=1) == [0.5]
    for name, text, n in (("number", "seven", None), ("number", "9", None), ("yes_no", "perhaps", None),
                          ("letter", "good", None), ("ranking", "2 > 2", 2)):
        with pytest.raises(Unparseable):
            parse(name, text, n=n)


def write_judge(tmp_path, name="judge.yaml", **options):
    path = tmp_path / name
    path.write_text(json.dumps(options) if name.endswith(".json") else "\n".join(
        f"{k}: {json.dumps(v)}" for k, v in options.items()))
    return f"judge:{path}"


@pytest.mark.parametrize("options,message", [
    ({"rubric": "x"}, "set exactly one of 'model'"),
    ({"model": "m", "endpoint": "http://h:1/v1"}, "set exactly one of 'model'"),
    ({"model": "m", "colour": 1}, "unknown key(s) ['colour']"),
    ({"model": "m", "parser": "ranking"}, "'parser' must be one of ['number', 'yes_no', 'letter'"),
    ({"model": "m", "group": True}, "'parser' must be one of ['ranking'"),
    ({"model": "m", "range": [5, 1]}, "'range' must be [low, high]"),
    ({"model": "m", "template": "{prompt} {answers}"}, "'template' uses ['answers']"),
    ({"model": "m", "retries": -1}, "'retries' must be a number >= 0"),
])
def test_a_bad_judge_file_is_a_one_line_error_naming_it(tmp_path, options, message):
    spec = write_judge(tmp_path, **options)
    with pytest.raises(ValueError) as info:
        load_reward_function(spec)
    assert message in str(info.value) and str(tmp_path) in str(info.value)
    with pytest.raises(ValueError, match="no such file"):
        load_reward_function(f"judge:{tmp_path}/missing.yaml")


class Script:
    """A scripted judge model: answer(question text) -> (text, top); records every question."""

    def __init__(self, answer):
        self.answer, self.questions = answer, []

    def __call__(self, messages, max_tokens):
        self.questions.append(messages[-1]["content"])
        return self.answer(messages[-1]["content"], len(self.questions))


def test_endpoint_judge_scores_caches_and_asks_again_when_unreadable(tmp_path):
    script = Script(lambda q, k: ("I cannot say" if k == 1 else ("5" if "friend" in q else "2"), None))
    with Served(make_app(None, chat=script)) as url:
        judge = load_reward_function(write_judge(tmp_path, endpoint=url, rubric="Be kind.", range=[1, 5]))
        scores = judge(["Say hi", "Say hi"], ["hi, kind friend", "go away"], answer=["hello", None])
        assert scores == [1.0, 0.25]
        assert len(script.questions) == 3  # two, then the unreadable one again
        assert "Reference answer:\nhello" in script.questions[0] and "Reference answer" not in script.questions[1]
        assert "Be kind." in script.questions[0] and "Reply with a single number from 1 to 5" in script.questions[0]
        assert judge.transcripts[1] == {"prompt": script.questions[1], "answer": "2"}
        assert judge(["Say hi"], ["go away"]) == [0.25] and len(script.questions) == 3  # cached
        assert judge(["Say hi"], ["go away"], answer=["hello"]) == [0.25] and len(script.questions) == 4


def test_endpoint_judge_that_never_answers_readably_stops_naming_the_judge(tmp_path):
    with Served(make_app(None, chat=Script(lambda q, k: ("no idea", None)))) as url:
        judge = ModelJudge(write_judge(tmp_path, endpoint=url, retries=2))
        with pytest.raises(JudgeError) as info:
            judge(["q"], ["a"])
    message = str(info.value)
    assert message.startswith(f"judge '{tmp_path}/judge.yaml': no score after 3 attempts")
    assert "no number in the answer; it answered 'no idea'" in message


def test_yes_no_judge_reads_the_first_tokens_log_probs_from_the_endpoint(tmp_path):
    with Served(make_app(None, chat=Script(lambda q, k: ("Yes", [("Yes", np.log(0.3)), ("No", np.log(0.6))])))) \
            as url:
        judge = ModelJudge(write_judge(tmp_path, endpoint=url, parser="yes_no"))
        assert judge(["q"], ["a"]) == [pytest.approx(1 / 3)]


def test_group_ranking_judge_ranks_each_prompts_answers_in_one_question(tmp_path):
    script = Script(lambda q, k: ("2 > 3 > 1" if "Answer 3" in q else "1 > 2", None))
    with Served(make_app(None, chat=script)) as url:
        judge = ModelJudge(write_judge(tmp_path, endpoint=url, parser="ranking", group=True))
        scores = judge(["p", "p", "p", "q", "q"], ["a", "b", "c", "d", "e"])
    assert scores == [0.0, 1.0, 0.5, 1.0, 0.0]
    assert len(script.questions) == 2 and "Answer 1:\na\n\nAnswer 2:\nb\n\nAnswer 3:\nc" in script.questions[0]
    assert judge.transcripts[0] == judge.transcripts[2] and judge.transcripts[3]["answer"] == "1 > 2"


def test_endpoint_down_is_a_judge_error_naming_the_judge(tmp_path):
    judge = ModelJudge(write_judge(tmp_path, endpoint="http://127.0.0.1:9/v1", retries=1, served_model="j"))
    with pytest.raises(JudgeError) as info:
        judge(["q"], ["a"])
    assert f"judge '{tmp_path}/judge.yaml' unreachable after 2 attempts" in str(info.value)


class AnswerLength(JudgeParser):  # a user's parser: registered by defining it
    NAME = "test_answer_length"
    instruction = "Say anything."

    def __call__(self, text, top, options):
        return min(1.0, len(text) / 100)


def test_a_local_model_judge_answers_greedily_in_its_chat_template(tmp_path, tiny_model_dir):
    from alignment.rewards.judge_backends import LocalJudgeModel

    judge = ModelJudge(write_judge(tmp_path, model=tiny_model_dir, parser="test_answer_length", max_tokens=12))
    scores = judge(["What is 2 + 2?", "Say hi"], ["4", "hi"])
    local = LocalJudgeModel(tiny_model_dir)
    direct = local.answer([judge.transcripts[0]["prompt"]], 12)
    assert direct[0] == (judge.transcripts[0]["answer"], None) and scores[0] == min(1.0, len(direct[0][0]) / 100)
    assert "What is 2 + 2?" in judge.transcripts[0]["prompt"] and "Answer:\n4" in judge.transcripts[0]["prompt"]


def test_a_local_yes_no_judge_reads_each_candidates_exact_probability(tmp_path, tiny_model_dir):
    """log p("No" | prompt) of the candidate equals a direct forward pass; the score is P(yes) / (P(yes) + P(no))
    over every spelling, so a tiny model that writes neither word still gives a score strictly inside (0, 1)."""
    import paddle

    from alignment.rewards.judge_backends import LocalJudgeModel
    from alignment.rewards.judge_parsers import YesNoParser

    judge = ModelJudge(write_judge(tmp_path, model=tiny_model_dir, parser="yes_no"))
    score = judge(["Is the sky blue?"], ["Yes."])[0]
    local = LocalJudgeModel(tiny_model_dir)
    ids = local.prompt_ids(judge.transcripts[0]["prompt"])
    pairs = dict(local.candidate_log_probs([ids], YesNoParser.candidates)[0])
    no = local.tokenizer.encode("No", add_special_tokens=False)
    logits = local.model(paddle.to_tensor([ids + no])).logits.astype("float64")
    direct = float(paddle.nn.functional.log_softmax(logits, axis=-1)[0, len(ids) - 1, no[0]])
    assert pairs["No"] == pytest.approx(direct, abs=1e-5) and len(no) == 1
    yes = sum(np.exp(v) for k, v in pairs.items() if k.strip().lower() == "yes")
    no_mass = sum(np.exp(v) for k, v in pairs.items() if k.strip().lower() == "no")
    assert 0 < score < 1 and score == pytest.approx(yes / (yes + no_mass))


GRPO = ["--advantage_estimator", "grpo", "--num_return_sequences", "2", "--per_device_prompt_batch_size", "2",
        "--per_device_train_batch_size", "4", "--max_new_tokens", "6", "--max_steps", "2", "--logging_steps", "1",
        "--disable_tqdm", "--eval_datasets", "", "--train_datasets", f"prompt-only:1.0:{REPO}/data/prompts/train.jsonl"]


def test_grpo_with_a_judge_reward_writes_its_prompts_and_answers_to_the_ledger(tmp_path, tiny_model_dir):
    from alignment.ppo import run_ppo

    script = Script(lambda q, k: (str(len(q) % 11), None))  # a number in [0, 10] from the question
    with Served(make_app(None, chat=script)) as url:
        spec = write_judge(tmp_path, endpoint=url, rubric="Is it cheerful?")
        run_ppo.main(["--actor_model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
                      "--reward_funcs", spec, "--rollout_ledger", "true", *GRPO])
    rows = read_metrics(tmp_path / "out")
    assert all(0 <= r[f"reward/{spec}"] <= 1 for r in rows)
    folder = tmp_path / "out" / "ledger"
    ledger = [json.loads(line) for name in sorted(os.listdir(folder)) if name.startswith("steps-")
              for line in open(folder / name)]
    assert len(ledger) == 8
    for row in ledger:
        note = row["judges"][spec]
        assert note["prompt"] in script.questions and "Is it cheerful?" in note["prompt"]
        assert row["reward_parts"][spec] == (len(note["prompt"]) % 11) / 10 == float(note["answer"]) / 10


def test_a_run_whose_judge_endpoint_is_down_stops_with_one_line(tmp_path, tiny_model_dir, capsys):
    from alignment.ppo import run_ppo

    spec = write_judge(tmp_path, endpoint="http://127.0.0.1:9/v1", served_model="j", retries=0)
    with pytest.raises(SystemExit) as info:
        run_ppo.main(["--actor_model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "out"),
                      "--reward_funcs", spec, *GRPO])
    assert info.value.code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: judge '{tmp_path}/judge.yaml' unreachable after 1 attempts")
