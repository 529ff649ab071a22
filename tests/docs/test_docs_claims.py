"""The docs' claims against the repository (docsgen/claims.py): the real pages pass, and a page with each kind of
defect fails naming the page, the line and the kind (a flag or key no parser takes, a missing repository path, a
figure typed outside a generated part, a paragraph cut mid-sentence, a machine's path, a peer at two versions)."""
import pytest

from docsgen import claims

GOOD = """# A page

A paragraph with `--max_steps 2`, `learning_rate: 1e-5` and `alignment/ppo/run_ppo.py`, ending as a sentence.

| key | meaning |
| --- | --- |
| `learning_rate` | the step size |

<!-- generated: results demo -->
| step s | ratio |
| --- | --- |
| 1.25 s | **0.47x** |
<!-- end generated -->

```bash
python alignment/ppo/run_ppo.py config/tiny/ppo_argument.json --max_steps 2  # took 12 s, 80% of the time
```

- a list item may start lowercase and end without a stop
"""


def problems(text, page="docs/bad.md"):
    return claims.check({page: text})


def kinds(text):
    return {(p.kind, p.line) for p in problems(text)}


def test_the_docs_and_readme_pass():
    found = claims.check_docs()
    assert not found, "\n".join(map(str, found))


def test_a_good_page_passes():
    assert problems(GOOD) == []


@pytest.mark.parametrize("line, kind", [
    ("Run it with `--max_stepz 2`.", "flag"),
    ("Run `python tools/predict.py --modle x`.", "flag"),
    ("Set `learning_rat: 1e-5` in the file.", "key"),
    ("See `alignment/ppo/no_such_module.py` for the rest.", "path"),
    ("The examples are in `examples/no_such_demo.sh`.", "path"),
    ("A step took 12.5 s on two cores.", "figure"),
    ("Decoding ran at 737 tokens/s.", "figure"),
    ("The peak was 13 GiB.", "figure"),
    ("The GEMM reached 424 GFLOP/s.", "figure"),
    ("Padding fell to 9% of the tokens.", "figure"),
    ("The update ran 1.48x faster.", "figure"),
    ("It waits 42 ms an add.", "figure"),
    ("synchronous run gives its tries, and the step keeps the groups.", "paragraph"),
    ("A sentence that stops with the key", "paragraph"),
    ("Run it under `flock /tmp/cpu.lock`.", "machine-path"),
    ("The peer's script is at /work/shared/peers/trl_baseline.py.", "machine-path"),
    ("Its installation lives in `/root/.pyenv`.", "machine-path"),
    ("The venv sits in `/home/me/venv`.", "machine-path"),
])
def test_each_defect_fails_on_its_line(line, kind):
    page = f"# A page\n\nAn opening paragraph.\n\n{line}\n"
    assert (kind, 5) in kinds(page), problems(page)


def test_a_key_table_names_argument_keys_only():
    page = "# Keys\n\n| key | meaning |\n| --- | --- |\n| `learning_rate` | fine |\n| `learnin_rate` | a typo |\n"
    assert kinds(page) == {("key", 6)}
    # the same names in a table about something else are not argument keys
    assert problems(page.replace("| key |", "| name |")) == []


def test_two_versions_of_one_peer_fail_across_pages():
    found = claims.check({"docs/a.md": "# A\n\nMeasured against TRL 1.12.0 here.\n",
                          "docs/b.md": "# B\n\nInstall `trl==1.16.0` first.\n"})
    assert [p.kind for p in found] == ["version"] and "TRL 1.12.0" in found[0].text + " TRL 1.12.0" \
        and "1.16.0" in found[0].text, found
    same = claims.check({"docs/a.md": "# A\n\nTRL 1.12.0 ran it.\n", "docs/b.md": "# B\n\nAs in TRL 1.12.\n"})
    assert same == []


def test_a_figure_in_a_generated_part_code_or_an_allowed_setting_passes():
    assert problems(GOOD) == []
    allowed = next(iter(claims.ALLOWED))
    assert problems(f"# A page\n\nThe limit is as said: {allowed}.\n") == []
    assert [p.kind for p in problems("# A page\n\nThe limit: at most 2 MiB.\n")] == ["figure"]


def test_a_paragraph_split_by_a_code_span_over_a_line_break_is_one_paragraph():
    page = "# A page\n\nRun `python tools/plot_run.py\n--help` and read it, then\n`python tools/plot_run.py x`.\n"
    assert problems(page) == []
    assert [p.kind for p in problems(page.replace("`python tools/plot_run.py x`.", "the rest"))] == ["paragraph"]


def test_the_known_flags_come_from_the_parsers():
    flags = claims.known().flags
    assert {"--max_steps", "--max-steps", "--env-modules", "--max-new-tokens", "--max_new_tokens",
            "--results-dir", "--record", "--inference_model"} <= flags
    assert "--max_stepz" not in flags and "--key_name" not in flags
