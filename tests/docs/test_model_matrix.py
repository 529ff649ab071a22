"""The Models page's per-family table (docsgen/model_matrix.py) cannot name a check that is not there: a test
function that is gone, or a file that does not name the family, stops the generation."""
import pytest

from docsgen import model_matrix
from docsgen.model_matrix import Check


def test_every_family_has_a_row_and_every_check_a_column():
    lines = model_matrix.model_matrix().splitlines()
    assert len(lines) == 2 + len(model_matrix.FAMILIES)
    assert all(line.count("|") == 3 + len(model_matrix.CHECKS) for line in lines)


def test_a_test_function_that_is_gone_stops_the_table():
    with pytest.raises(ValueError, match="tests/models/test_moe.py defines no test_that_does_not_exist"):
        Check("tests/models/test_moe.py", "test_that_does_not_exist").short_name("qwen3_moe")


def test_a_file_that_does_not_name_the_family_stops_the_table():
    with pytest.raises(ValueError, match="tests/models/test_moe.py does not name \"mistral\""):
        Check("tests/models/test_moe.py", "test_lora_wraps_every_expert_and_not_the_router").short_name("mistral")
    assert Check("tests/models/test_moe.py", "test_lora_wraps_every_expert_and_not_the_router").short_name(
        "qwen3_moe") == "moe"
