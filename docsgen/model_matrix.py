"""The Models page's table of what the tests verify per model family. Each cell names the test file and function
that checks it; generating the table fails (so `python -m docsgen --check`, the site build and tests/docs/test_docs.py
fail) when that function is gone from its file or the file no longer names the family, so the table cannot claim
a check that is not there. An empty cell is a check no test makes."""
from __future__ import annotations

import os
import re
from typing import Dict, List, NamedTuple, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAMILIES: List[Tuple[str, str]] = [  # (model_type, the checkpoints people train)
    ("llama", "Llama 3.1 8B / 70B, Llama 3.2 1B / 3B, SmolLM2 135M-1.7B"),
    ("qwen2", "Qwen2.5 0.5B-72B"),
    ("mistral", "Mistral 7B"),
    ("qwen3", "Qwen3 0.6B-32B"),
    ("ernie4_5", "ERNIE-4.5-0.3B"),
    ("qwen3_moe", "Qwen3-30B-A3B, Qwen3-235B-A22B"),
    ("ernie4_5_moe", "ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B"),
]
CHECKS: List[Tuple[str, str]] = [  # (key, column heading)
    ("logits", "logits = transformers' (recorded)"),
    ("live", "logits, greedy tokens, our save read by transformers (live, slow suite)"),
    ("greedy", "greedy tokens with the KV cache (recorded)"),
    ("gguf", "GGUF import"),
    ("lora", "LoRA"),
    ("stages", "every stage one step"),
    ("export", "export for inference"),
    ("layouts", "parallel layouts = one process"),
    ("replay", "MoE routing replay"),
]
ALL = [name for name, _ in FAMILIES]
DENSE_NEW = ["qwen3", "ernie4_5"]
MOE = ["qwen3_moe", "ernie4_5_moe"]
FIXTURED = ["llama"] + DENSE_NEW + MOE  # tests/fixtures/models (Llama 3.x RoPE scalings as llama3, linear, ...)
# (check, family): the tests that check it
VERIFIED: Dict[Tuple[str, str], List["Check"]] = {}


class Check(NamedTuple):
    """A test function in `path`; `token` (default: the family's model type, quoted) must appear in `where`
    (default: `path`), the file that names what the test runs on."""
    path: str
    function: str
    token: Optional[str] = None
    where: Optional[str] = None

    def short_name(self, family: str) -> str:
        """The file's short name, after checking that it defines the function and names the family."""
        if not re.search(rf"^def {re.escape(self.function)}\(", _read(self.path), re.M):
            raise ValueError(f"docsgen/model_matrix.py: {self.path} defines no {self.function}")
        token = self.token or f'"{family}"'
        if token not in _read(self.where or self.path):
            raise ValueError(f"docsgen/model_matrix.py: {self.where or self.path} does not name {token}")
        return os.path.basename(self.path)[len("test_"):-len(".py")]


def _read(path: str) -> str:
    full = os.path.join(REPO, path)
    if not os.path.isfile(full):
        raise ValueError(f"docsgen/model_matrix.py: {path} does not exist")
    with open(full, encoding="utf-8") as f:
        return f.read()


def verified(check: str, families: List[str], *tests: Check) -> None:
    for family in families:
        VERIFIED.setdefault((check, family), []).extend(tests)


TINY = "tiny_model_dir"  # the tiny LLaMA the suites build (tests/conftest.py)
STAGE_FAMILIES = "tests/training/test_family_stages.py"  # FAMILIES: llama3, qwen3, ernie4_5 and the MoE families
verified("logits", ["llama", "qwen2"], Check("tests/models/test_hf_parity.py", "test_logits_match_transformers"))
verified("logits", FIXTURED, Check("tests/models/test_model_families.py", "test_logits_match_transformers", '"llama3"'))
for family in ALL:
    verified("live", [family], *(Check("tests/models/test_transformers_live.py", function,
                                      '"llama3"' if family == "llama" else None)
                                 for function in ("test_logits_equal_transformers",
                                                  "test_greedy_tokens_through_the_decode_engine_are_transformers",
                                                  "test_what_we_save_loads_in_transformers_with_our_logits")))
verified("greedy", ["llama", "qwen2"], Check("tests/models/test_hf_parity.py", "test_greedy_tokens_match_transformers"))
verified("greedy", FIXTURED, Check("tests/models/test_model_families.py",
                                  "test_greedy_tokens_through_the_decode_engine_match_transformers", '"llama3"'))
verified("gguf", ["llama"], Check("tests/models/test_import_gguf.py", "test_weights_are_unpermuted_hf_layout", "llama"))
verified("gguf", ["qwen2"] + DENSE_NEW + MOE, Check("tests/models/test_import_gguf_families.py",
                                                   "test_imported_logits_are_the_checkpoints"))
verified("lora", ["llama"], Check("tests/models/test_lora.py",
                                 "test_lora_sft_trains_adapters_and_merges_to_the_same_logits", TINY))
verified("lora", FIXTURED, Check("tests/models/test_family_lora.py",
                                 "test_lora_trains_saves_and_merges_on_every_family", '"llama3"', STAGE_FAMILIES))
verified("lora", ["qwen3_moe"], Check("tests/models/test_moe.py", "test_lora_wraps_every_expert_and_not_the_router"))
verified("stages", FIXTURED, Check("tests/training/test_family_stages.py", "test_every_stage_trains_every_family",
                                  '"llama3"'))
verified("export", FIXTURED, Check("tests/inference/test_family_export.py",
                                  "test_the_exported_program_gives_the_dynamic_models_logits", '"llama3"',
                                  STAGE_FAMILIES))
verified("layouts", ["llama"], Check("tests/parallel/test_layouts.py", "test_combined_layout_equals_one_process", TINY))
verified("layouts", DENSE_NEW + MOE, Check("tests/parallel/test_family_layouts.py",
                                          "test_a_family_under_a_layout_equals_one_process"))
verified("layouts", MOE, Check("tests/parallel/test_expert_layouts.py", "test_expert_parallel_step_equals_one_process"),
         Check("tests/parallel/test_moe_tensor_parallel.py", "test_a_tensor_parallel_step_equals_one_process"))
verified("replay", MOE, Check("tests/models/test_moe_replay.py",
                             "test_replay_routes_the_training_forward_as_the_sampler_did"))
verified("replay", ["qwen3_moe"], Check("tests/ppo/test_moe_replay_episodes.py",
                                       "test_with_replay_the_first_ratio_is_exactly_one_and_no_routing_differs",
                                       "qwen3_moe"))


def model_matrix() -> str:
    lines = ["| family | what people train | " + " | ".join(heading for _, heading in CHECKS) + " |",
             "| --- | --- | " + " | ".join("---" for _ in CHECKS) + " |"]
    for family, sizes in FAMILIES:
        cells = []
        for check, _ in CHECKS:
            files = []
            for test in VERIFIED.get((check, family), []):
                short = test.short_name(family)
                if short not in files:
                    files.append(short)
            cells.append(", ".join(f"`{f}`" for f in files))
        lines.append(f"| `{family}` | {sizes} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
