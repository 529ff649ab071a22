"""Scripted tool-use traces (alignment/envs/traces.py): played through the real environment, and tokenised for SFT
exactly as a multi-turn rollout lays out the same episode (the tiny model's ChatML tokenizer)."""
import types

import pytest

from alignment.data.tokenized import IGNORE_INDEX, tokenize_conversation
from alignment.envs import ToolEnvironment
from alignment.envs.multiturn import multi_turn_rollout
from alignment.envs.traces import check_trace, rollout_layout, scripted_episode
from alignment.models import GenerationConfig, Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return Tokenizer.from_pretrained(tiny_model_dir)


def trace(fmt="hermes-compact", answer="The answer is 419527."):
    env = ToolEnvironment(format=fmt)
    call = env.format.format_call("calculator", {"expression": "4821 * 87 + 100"})
    return env, scripted_episode(env, {"input": "What is 4821 * 87 + 100?"}, [call, answer])


def test_a_scripted_episode_holds_the_environments_prompt_and_the_calculators_real_result():
    env, messages = trace()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[0]["content"] == env.reset({"input": "x"})[0]["content"]
    assert messages[3]["content"] == "419527"


def test_an_episode_that_does_not_end_at_the_last_scripted_turn_is_refused():
    env = ToolEnvironment()
    call = env.format.format_call("calculator", {"expression": "1 + 1"})
    with pytest.raises(ValueError, match="did not end at scripted turn 1 of 1"):
        scripted_episode(env, {"input": "1 + 1?"}, [call])
    with pytest.raises(ValueError, match="ended at scripted turn 1 of 2"):
        scripted_episode(ToolEnvironment(), {"input": "1 + 1?"}, ["2", "2"])


@pytest.mark.parametrize("fmt", ["hermes", "hermes-compact"])
def test_sft_ids_are_the_rollout_ids_and_every_sampled_token_is_trained(tok, fmt):
    env, messages = trace(fmt)
    check_trace(tok, messages, env.stop_strings)
    ids, mask = rollout_layout(tok, messages, env.stop_strings)
    sft_ids, labels = tokenize_conversation(tok, messages)
    assert ids == sft_ids
    sampled = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert sampled == messages[2]["content"] + messages[4]["content"] + "<|im_end|>"
    # SFT trains on the template's end of the call turn too (never sampled: the rollout stops at </tool_call>)
    assert sum(label != IGNORE_INDEX for label in labels) == sum(mask) + len(tok.encode("<|im_end|>\n"))


def test_a_trace_whose_rollout_would_tokenise_differently_is_refused(tiny_model_dir):
    """A template that trims contents (as Llama 3's does) renders a trailing newline away for SFT, while a policy
    that writes it keeps it: the trace would teach ids a rollout never holds."""
    tok = Tokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = tok.chat_template.replace("message['content']", "message['content'] | trim")
    env, messages = trace(answer="The answer is 419527.\n")
    with pytest.raises(ValueError, match="tokenises differently for SFT and in a rollout from token"):
        check_trace(tok, messages, env.stop_strings)
    check_trace(tok, trace()[1], env.stop_strings)  # without the newline the template's trim changes nothing


def test_the_rollout_layout_is_what_multi_turn_rollout_builds_when_the_policy_writes_the_trace(tok, tiny_model_dir):
    """Force a model to write the trace's turns (a stand-in whose logits pick the trace's next token): the
    trajectory's ids and action mask are rollout_layout's."""
    import paddle

    from alignment.models import LlamaForCausalLM

    env, messages = trace()
    ids, mask = rollout_layout(tok, messages, env.stop_strings)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    script = iter([t for t, m in zip(ids, mask) if m])

    class Scripted:
        config = model.config

        def __call__(self, input_ids, **kwargs):
            out = model(input_ids, **kwargs)  # the real cache, so positions and masks are exercised
            logits = paddle.full(out.logits.shape, -1e4, dtype=out.logits.dtype)
            logits[:, -1, next(script)] = 0.0
            return types.SimpleNamespace(logits=logits, past_key_values=out.past_key_values)

    config = GenerationConfig(max_new_tokens=64, do_sample=False, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id)
    episode = multi_turn_rollout(Scripted(), tok, [ToolEnvironment(format="hermes-compact")],
                                 [{"input": "What is 4821 * 87 + 100?"}], config, 3, 256)[0]
    assert episode.input_ids == ids and episode.action_mask == mask
    assert episode.messages == messages
