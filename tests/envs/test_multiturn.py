"""Multi-turn rollouts on the tiny model: the ids are the ids sampled, observations are the chat template's text
verbatim and masked, the sampler's log-probs equal a teacher-forced forward of the final sequence (so the carried
KV cache is right), turn limits and token budgets hold, rows end at different turns and leave the batch."""
import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from alignment.envs import Environment, EnvironmentFailure, StepResult
from alignment.envs.chat import continuation_text
from alignment.envs.multiturn import multi_turn_rollout
from alignment.models import GenerationConfig, LlamaForCausalLM, Tokenizer, generate
from tests.scripted_model import Scripted

PROMPTS = ["What is two plus two?", "Hi", "Tell me a long story about a cat and a dog, please."]


class Countdown(Environment):
    """Ends after row["turns"] turns (0: never); answers turn k with "turn k", reward k (10 k at the end)."""
    NAME = "test-countdown"

    def reset(self, row):
        self.turns, self.k, self.texts = row["turns"], 0, []
        return [{"role": "user", "content": row["input"]}]

    def step(self, assistant_message):
        self.k += 1
        self.texts.append(assistant_message)
        if self.k == self.turns:
            return StepResult([], 10.0 * self.k, True)
        return StepResult([{"role": "user", "content": f"turn {self.k}"}], float(self.k), False, {"tool_calls": 1})


class Stopping(Countdown):
    NAME = "test-countdown-stop"

    def __init__(self, stop):
        self.stop_strings = (stop,)


class Broken(Countdown):
    NAME = "test-broken"

    def step(self, assistant_message):
        raise RuntimeError("the game crashed")


class Recorder:
    """The model, recording the shapes of each forward (a wrapper passed in place of the model)."""

    def __init__(self, model):
        self.model, self.config, self.calls = model, model.config, []

    def __call__(self, input_ids, **kwargs):
        self.calls.append((list(input_ids.shape), list(kwargs["attention_mask"].shape)))
        return self.model(input_ids, **kwargs)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    paddle.seed(5)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model, Tokenizer.from_pretrained(tiny_model_dir)


def rollout(tiny, turns, config, max_turns=6, max_total_tokens=200, env=Countdown, **kwargs):
    model, tokenizer = tiny
    rows = [{"input": PROMPTS[i % len(PROMPTS)], "turns": t} for i, t in enumerate(turns)]
    envs = [env() for _ in rows]
    return multi_turn_rollout(model, tokenizer, envs, rows, config, max_turns, max_total_tokens, **kwargs), envs


def greedy(tokenizer, max_new_tokens=4, eos=None):
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                            pad_token_id=tokenizer.pad_token_id)


def segments(trajectory):
    """[(is_action, start, end)] runs of the action mask after the prompt."""
    mask, runs, start = trajectory.action_mask, [], trajectory.prompt_len
    for i in range(trajectory.prompt_len + 1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((bool(mask[start]), start, i))
            start = i
    return runs


def test_rows_end_at_different_turns_and_finished_rows_leave_the_batch(tiny):
    model, tokenizer = tiny
    recorder = Recorder(model)
    rows = [{"input": PROMPTS[i], "turns": t} for i, t in enumerate([1, 3, 2])]
    envs = [Countdown() for _ in rows]
    paddle.seed(1)
    config = GenerationConfig(max_new_tokens=4, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    trajectories = multi_turn_rollout(recorder, tokenizer, envs, rows, config, max_turns=6, max_total_tokens=200)
    assert [t.num_turns for t in trajectories] == [1, 3, 2]
    assert [t.turn_rewards for t in trajectories] == [[10.0], [1.0, 2.0, 30.0], [1.0, 20.0]]
    assert [t.tool_calls for t in trajectories] == [0, 2, 1] and not any(t.truncated for t in trajectories)
    assert [len(env.texts) for env in envs] == [1, 3, 2]
    for t in trajectories:  # the episode ends on the policy's last token: nothing is appended after done
        assert t.action_mask[-1] == 1 and [run[0] for run in segments(t)] == [True, False] * (t.num_turns - 1) + [True]
        assert [m["role"] for m in t.messages] == ["user"] + ["assistant", "user"] * (t.num_turns - 1) + ["assistant"]
    # the engine's shapes: each prefill runs one row's new ids over its own tokens ([1, n] against [1, t + n]), each
    # decode step every slot ([3, 1] against the fixed cache width), whatever the rows are doing
    prefills = [(shape, mask) for shape, mask in recorder.calls if shape[1] > 1 or shape[0] == 1]
    steps = [(shape, mask) for shape, mask in recorder.calls if (shape, mask) not in prefills]
    assert len(prefills) == 3 + 2 + 1  # three prompts, then one continuation per turn stepped and not last
    assert all(shape[0] == 1 and mask == [1, mask[1]] for shape, mask in prefills)
    assert {tuple(shape) for shape, _ in steps} == {(3, 1)} and len({tuple(mask) for _, mask in steps}) == 1
    # 3 decode steps per turn (4 tokens, the last one not fed); the rows' 6 turns overlap in time
    assert 3 * 6 > len(steps) >= 3 * 3


def test_observations_are_the_template_text_verbatim_and_masked(tiny):
    model, tokenizer = tiny
    (trajectory,), _ = rollout(tiny, [3], greedy(tokenizer, max_new_tokens=3))
    ids = trajectory.input_ids
    prompt = f"<|im_start|>user\n{PROMPTS[0]}<|im_end|>\n<|im_start|>assistant\n"
    assert ids[: trajectory.prompt_len] == tokenizer.encode(prompt)
    observations = [(start, end) for action, start, end in segments(trajectory) if not action]
    assert len(observations) == 2
    for k, (start, end) in enumerate(observations, 1):
        text = f"<|im_end|>\n<|im_start|>user\nturn {k}<|im_end|>\n<|im_start|>assistant\n"
        assert ids[start:end] == tokenizer.encode(text)
        assert tokenizer.decode(ids[start:end], skip_special_tokens=False) == text
        assert set(trajectory.action_mask[start:end]) == {0} and set(trajectory.log_probs[start:end]) == {0.0}
    assert sum(trajectory.action_mask) == 9


def test_greedy_turns_equal_single_turn_generation_over_the_same_prefix(tiny):
    model, tokenizer = tiny
    trajectories, _ = rollout(tiny, [2, 3, 1], greedy(tokenizer, max_new_tokens=5))
    for trajectory in trajectories:
        turns = [(start, end) for action, start, end in segments(trajectory) if action]
        assert len(turns) == trajectory.num_turns
        for start, end in turns:
            prefix = paddle.to_tensor([trajectory.input_ids[:start]])
            out = generate(model, prefix, paddle.ones_like(prefix), greedy(tokenizer, max_new_tokens=end - start))
            assert out.sequences[0, start:].numpy().tolist() == trajectory.input_ids[start:end]


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_sampled_log_probs_equal_a_teacher_forced_forward(tiny, penalty):
    model, tokenizer = tiny
    paddle.seed(3)
    config = GenerationConfig(max_new_tokens=6, do_sample=True, temperature=0.8, top_k=50, repetition_penalty=penalty,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    trajectories, _ = rollout(tiny, [3, 1, 2], config, log_prob_temperature=0.8)
    for trajectory in trajectories:
        ids = np.asarray(trajectory.input_ids)
        logits = model(paddle.to_tensor(ids[None])).logits[0] / 0.8  # [L, vocab]
        forced = F.log_softmax(logits, axis=-1).numpy()  # [L, vocab]
        actions = np.flatnonzero(trajectory.action_mask)
        expected = forced[actions - 1, ids[actions]]  # the token at t is predicted at t - 1
        np.testing.assert_allclose(np.asarray(trajectory.log_probs)[actions], expected, atol=1e-5, rtol=0)
        assert np.all(np.asarray(trajectory.log_probs)[np.asarray(trajectory.action_mask) == 0] == 0.0)


def test_the_turn_limit_ends_an_episode_that_never_ends(tiny):
    model, tokenizer = tiny
    trajectories, envs = rollout(tiny, [0, 0], greedy(tokenizer, max_new_tokens=3), max_turns=3)
    for trajectory, env in zip(trajectories, envs):
        assert trajectory.num_turns == 3 and trajectory.truncated and len(env.texts) == 3
        assert trajectory.turn_rewards == [1.0, 2.0, 3.0] and trajectory.action_mask[-1] == 1
        assert sum(trajectory.action_mask) == 9


def test_the_token_budget_cuts_an_observation_or_a_turn(tiny):
    model, tokenizer = tiny
    observation = len(tokenizer.encode("<|im_end|>\n<|im_start|>user\nturn 1<|im_end|>\n<|im_start|>assistant\n"))
    # the first observation does not fit with room for one more token: not appended, the turn was stepped
    (short,), _ = rollout(tiny, [0], greedy(tokenizer, max_new_tokens=8), max_total_tokens=8 + observation)
    assert len(short.input_ids) - short.prompt_len == 8
    assert short.truncated and short.num_turns == 1 and short.turn_rewards == [1.0]
    # room for 3 tokens of the second turn: cut there, not given to the environment
    (cut,), envs = rollout(tiny, [0], greedy(tokenizer, max_new_tokens=8), max_total_tokens=8 + observation + 3)
    assert len(cut.input_ids) - cut.prompt_len == 8 + observation + 3
    assert cut.action_mask[-3:] == [1, 1, 1] and cut.action_mask[-4] == 0
    assert cut.truncated and cut.num_turns == 1 and len(envs[0].texts) == 1


def test_eos_and_stop_strings_end_a_turn(tiny):
    model, tokenizer = tiny
    (free,), _ = rollout(tiny, [1], greedy(tokenizer, max_new_tokens=8))
    turn = free.input_ids[free.prompt_len:]
    j = next(j for j in range(2, 8) if turn[j] not in turn[:j])
    (stopped,), envs = rollout(tiny, [1], greedy(tokenizer, max_new_tokens=8, eos=turn[j]))
    assert stopped.input_ids[stopped.prompt_len:] == turn[: j + 1]
    assert envs[0].texts == [tokenizer.decode(turn[:j], skip_special_tokens=False)]  # the eos text is not passed on

    texts = [tokenizer.decode(turn[: k + 1], skip_special_tokens=False) for k in range(8)]  # after token k
    added = [texts[k][len(texts[k - 1]):] for k in range(1, 8)]
    k = next(k for k in range(2, 8) if added[k - 1] and added[k - 1] not in texts[k - 1])
    stop = added[k - 1]  # text that first appears with token k
    (ended,), envs = rollout(tiny, [1], greedy(tokenizer, max_new_tokens=8), env=lambda: Stopping(stop))
    assert ended.input_ids[ended.prompt_len:] == turn[: k + 1]
    assert envs[0].texts == [texts[k]] and envs[0].texts[0].endswith(stop)


def test_an_environment_that_raises_stops_the_rollout_with_its_name(tiny):
    model, tokenizer = tiny
    with pytest.raises(EnvironmentFailure) as err:
        rollout(tiny, [2], greedy(tokenizer), env=Broken)
    assert str(err.value) == "environment 'test-broken': step raised RuntimeError: the game crashed"


# --------------------------------------------------------------------------- continuation text of chat templates

QWEN_LIKE = (  # Qwen2.5's handling of tool messages: consecutive ones share one user turn
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
HISTORY = [{"role": "user", "content": "1234 * 5?"}, {"role": "assistant", "content": " <tool_call>...</tool_call>"}]
RESULTS = [{"role": "tool", "content": "6170"}, {"role": "tool", "content": "Error: x"}]


def test_continuation_of_the_tiny_chatml_template(tiny):
    _, tokenizer = tiny
    assert continuation_text(tokenizer, HISTORY, RESULTS[:1]) == (
        "<|im_end|>\n<|im_start|>tool\n6170<|im_end|>\n<|im_start|>assistant\n")
    assert continuation_text(tokenizer, HISTORY, RESULTS[:1], sampled_close="<|im_end|>") == (
        "\n<|im_start|>tool\n6170<|im_end|>\n<|im_start|>assistant\n")


def test_continuation_of_a_template_that_groups_tool_messages(tiny):
    _, base = tiny
    tokenizer = Tokenizer(base._tok, {**base.config, "chat_template": QWEN_LIKE})
    assert continuation_text(tokenizer, HISTORY, RESULTS, sampled_close="<|im_end|>") == (
        "\n<|im_start|>user\n<tool_response>\n6170\n</tool_response>\n<tool_response>\nError: x\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_hides_assistant_content_is_refused(tiny):
    _, base = tiny
    hiding = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}{% endfor %}"
    tokenizer = Tokenizer(base._tok, {**base.config, "chat_template": hiding})
    with pytest.raises(ValueError, match="its chat template does not render an assistant message's content "
                                         "verbatim once"):
        continuation_text(tokenizer, HISTORY, RESULTS)


# --------------------------------------------------------------------------- tool calls end to end


@pytest.mark.parametrize("call, result, errors", [
    ('{"name": "calculator", "arguments": {"expression": "1234 * 5"}}', "6170", 0),
    ('{"name": "python", "arguments": {"code": "print(1234 * 5)"}}', "6170\n", 0),
    ('{"name": "calculator", "arguments": {"expression": "1234 *"}}',
     "Error: tool 'calculator' raised CalculatorError: not an arithmetic expression (invalid syntax)", 1),
    ('{"name": "calculator" "arguments": {}}', None, 1),
])
def test_a_tool_call_turn_stops_at_the_close_tag_and_its_result_is_the_next_observation(tiny, call, result, errors):
    from alignment.envs import ToolEnvironment

    model, tokenizer = tiny
    first = f"<tool_call>\n{call}\n</tool_call>"
    script = tokenizer.encode(first) + tokenizer.encode("It is 6170.") + [tokenizer.eos_token_id]
    rows = [{"input": "What is 1234 * 5?", "answer": "6170"}]
    envs = [ToolEnvironment(tools=["calculator", "python"],
                            reward_fn=lambda answer, row: float(row["answer"] in answer)) for _ in rows]
    config = GenerationConfig(max_new_tokens=64, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    trajectories = multi_turn_rollout(Scripted(model, script), tokenizer, envs, rows, config, max_turns=4,
                                      max_total_tokens=400)
    for trajectory in trajectories:
        assert trajectory.num_turns == 2 and trajectory.turn_rewards == [0.0, 1.0] and not trajectory.truncated
        assert (trajectory.tool_calls, trajectory.tool_errors) == (1, errors) and trajectory.tool_time > 0
        tool_message = trajectory.messages[3]
        assert trajectory.messages[2] == {"role": "assistant", "content": first}
        assert tool_message["role"] == "tool" and trajectory.messages[4] == {"role": "assistant",
                                                                              "content": "It is 6170."}
        if result is None:
            assert tool_message["content"].startswith("Error: tool call is not valid JSON")
        else:
            assert tool_message["content"] == result
        text = tokenizer.decode(trajectory.input_ids[trajectory.prompt_len:], skip_special_tokens=False)
        assert text == (f"{first}<|im_end|>\n<|im_start|>tool\n{tool_message['content']}<|im_end|>\n"
                        f"<|im_start|>assistant\nIt is 6170.<|im_end|>")
        assert sum(trajectory.action_mask) == len(script)


def test_turn_ends_and_the_padded_batch_layout(tiny):
    from alignment.envs.multiturn import Trajectory, pad_trajectories

    _, tokenizer = tiny
    trajectories, _ = rollout(tiny, [2, 1], greedy(tokenizer, max_new_tokens=3))
    long = trajectories[0]
    assert long.turn_ends == [long.prompt_len + 2, len(long.input_ids) - 1]
    assert all(long.action_mask[i] == 1 for i in long.turn_ends) and long.action_mask[long.turn_ends[0] + 1] == 0

    a = Trajectory([5, 6, 7, 8, 9, 10], [0, 0, 1, 0, 1, 1], [0, 0, -0.5, 0, -1.0, -2.0], 2, [1.0], [5], [], {})
    b = Trajectory([1, 2, 3, 4], [0, 0, 0, 1], [0, 0, 0, -0.25], 3, [0.0], [3], [], {})
    batch = pad_trajectories([a, b], pad_id=0)
    assert batch["prompt_len"] == 3
    assert batch["input_ids"].tolist() == [[0, 5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]]
    assert batch["response_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert batch["action_mask"].tolist() == [[1, 0, 1, 1], [1, 0, 0, 0]]
    assert batch["log_probs"].tolist() == [[-0.5, 0, -1.0, -2.0], [-0.25, 0, 0, 0]]


def test_the_example_user_environment_loads_from_its_file_and_plays(tiny):
    from alignment.envs import load_environment_modules, make_environment
    from tests.helpers import REPO

    model, tokenizer = tiny
    load_environment_modules(["examples/guess_number_env.py"], base_dir=REPO)
    env = make_environment("guess-number")
    env.reset({"answer": 42})
    assert env.step("50") == StepResult([{"role": "user", "content": "Lower."}], -0.1, False)
    assert env.step("I say 42") == StepResult([], 1.0, True)

    rows = [{"answer": 42}, {"answer": 7}]
    envs = [make_environment("guess-number") for _ in rows]
    trajectories = multi_turn_rollout(model, tokenizer, envs, rows, greedy(tokenizer, max_new_tokens=4), max_turns=3,
                                      max_total_tokens=200)
    for trajectory in trajectories:  # the random tiny model plays on until the turn limit (or guesses)
        assert 1 <= trajectory.num_turns <= 3 and len(trajectory.turn_rewards) == trajectory.num_turns
        assert trajectory.messages[0]["content"].startswith("I am thinking of a number")
        feedback = [m["content"] for m in trajectory.messages[2::2]]
        assert set(feedback) <= {"Higher.", "Lower.", "Please answer with a number."}
