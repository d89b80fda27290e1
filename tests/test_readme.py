"""The README as a newcomer meets it: its python snippets run as shown, top to bottom, from a
fresh checkout's layout, and print what the README says they print; its set-up commands are the
ones CI runs; its links (and those of docs/ and theory.md) lead to files and headings that exist.

The snippet under "## Use with TRL" is run by tests/llm/test_llm_trl_readme.py (it needs the
trl extra), so it is skipped here. A block's lines ``# out: TEXT`` are what it prints: each
TEXT must appear in its output, in that order."""

import glob
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
DOCS = [README, os.path.join(REPO, "docs", "findings.md"),
        os.path.join(REPO, "docs", "reference.md"), os.path.join(REPO, "theory.md"),
        *sorted(glob.glob(os.path.join(REPO, "docs", "experiments", "*.md")))]
SNIPPET_SECONDS = 60  # each block; the calculator's take ~2 s here
OWN_TEST = {"Use with TRL": "tests/llm/test_llm_trl_readme.py"}
# What a fresh clone holds besides the tracked files: nothing a snippet may rely on.
NOT_IN_A_CLONE = {".git", ".venv", "runs", "sweeps", "__pycache__", ".pytest_cache",
                  ".hypothesis"}


def python_blocks(text: str) -> list[tuple[str, str]]:
    """(the ``## `` heading it sits under, code) for every ```python block, in order."""
    out, heading = [], ""
    for match in re.finditer(r"^## ([^\n]+)$|^```python\n(.*?)^```", text, re.M | re.S):
        if match.group(1) is not None:
            heading = match.group(1).strip()
        else:
            out.append((heading, match.group(2)))
    return out


def expected_output(code: str) -> list[str]:
    return [line.split("# out:", 1)[1].strip() for line in code.splitlines()
            if line.startswith("# out:")]


def readme_blocks() -> list[tuple[str, str]]:
    with open(README, encoding="utf-8") as fh:
        return [(h, c) for h, c in python_blocks(fh.read()) if h not in OWN_TEST]


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A folder laid out as a fresh clone: the repository's top-level entries linked in,
    without a venv or run outputs, so a snippet's relative paths resolve as they would."""
    root = tmp_path_factory.mktemp("clone")
    for name in os.listdir(REPO):
        if name not in NOT_IN_A_CLONE:
            os.symlink(os.path.join(REPO, name), root / name)
    return root


def test_the_readme_has_python_snippets_and_the_trl_one_is_tested_elsewhere():
    with open(README, encoding="utf-8") as fh:
        headings = [h for h, _ in python_blocks(fh.read())]
    assert len(readme_blocks()) >= 2 and "Use with TRL" in headings
    assert os.path.exists(os.path.join(REPO, OWN_TEST["Use with TRL"]))


@pytest.mark.parametrize("index", range(len(readme_blocks())))
def test_readme_snippet_runs_as_shown(index, clone):
    heading, code = readme_blocks()[index]
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", code], cwd=clone, env=env, text=True,
                          capture_output=True, timeout=SNIPPET_SECONDS)
    assert done.returncode == 0, f"README block {index} ({heading}) failed:\n{done.stderr}"
    rest = done.stdout
    for want in expected_output(code):
        assert want in rest, f"README block {index} ({heading}): {want!r} not in\n{done.stdout}"
        rest = rest[rest.index(want) + len(want):]


def test_the_set_up_commands_are_the_ones_ci_runs():
    with open(README, encoding="utf-8") as fh:
        text = fh.read()
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as fh:
        ci = fh.read()
    test_cmd = re.search(r"TEST_CMD='(.*)'", ci).group(1)
    setup = text.index("```bash\n", text.index("## Set up"))
    first_block = text[setup:text.index("```\n", setup + 8)]
    assert test_cmd in first_block
    assert ('python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e ".[all]" && '
            '.venv/bin/python -m llm_experiments demo --out runs/demo') in first_block


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as fh:
        text = re.sub(r"^```.*?^```", "", fh.read(), flags=re.M | re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} ([^\n]+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=os.path.basename)
def test_links_lead_to_files_and_headings_that_exist(doc):
    with open(doc, encoding="utf-8") as fh:
        text = re.sub(r"^```.*?^```", "", fh.read(), flags=re.M | re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        target, _, anchor = link.partition("#")
        path = os.path.normpath(os.path.join(os.path.dirname(doc), target)) if target else doc
        assert os.path.exists(path), f"{os.path.basename(doc)}: {link} -> no {path}"
        if anchor:
            assert anchor in anchors(path), f"{os.path.basename(doc)}: {link}: no such heading"
