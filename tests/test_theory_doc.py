"""theory.md stays consistent with the code that cites it and the code it names.

* every section a citation of theory.md names (in .py, .md, .yaml and .ipynb files) is a
  heading of theory.md;
* the check-values table of section 5 agrees with ``replaytheory.optimal_design``;
* every dotted name theory.md, or a study's record moved from it (``docs/experiments/``), gives
  as an implementation can be imported.
"""

import glob
import importlib
import json
import math
import os
import re

import pytest

from replaytheory import PowerLawNoise, optimal_design

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "theory.md")
EXPERIMENTS = sorted(glob.glob(os.path.join(ROOT, "docs", "experiments", "*.md")))
SUFFIXES = (".py", ".md", ".yaml", ".ipynb")
SELF = os.path.relpath(os.path.abspath(__file__), ROOT)  # its examples are not citations

_NUM = r"\d+(?:\.\d+)*"
_LIST = rf"{_NUM}(?:\s*(?:-|,|and|to)\s*{_NUM})*"
# "theory.md section 5", "`theory.md` (sections 3-5)", "theory.md sections 1, 3 and 4",
# "theory.md s1-2", "theory.md section 5.2", across a line break too.
CITATION = re.compile(rf"theory\.md`?\s*\(?\s*(?:sections?\s+|s)({_LIST})")
# Bare "section 4" / "sections 4-5, 8": by project convention these cite theory.md as well.
BARE = re.compile(rf"(?<![\w.])sections?\s+({_LIST})")
HEADING = re.compile(rf"^#{{2,4}}\s+({_NUM})\.?\s", re.M)
DOTTED = re.compile(r"`((?:replaytheory|llm_experiments)(?:\.\w+)+)`")


def _doc() -> str:
    with open(DOC) as fh:
        return fh.read()


def _sources():
    """(relative path, text) of every file that may cite theory.md; notebooks as the joined
    cell sources, so a citation split over two source lines reads as one."""
    for root, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith((".venv", ".git"))]
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, ROOT)
            if not name.endswith(SUFFIXES) or rel in ("theory.md", SELF):
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            if name.endswith(".ipynb"):
                cells = json.loads(text).get("cells", [])
                text = "\n".join("".join(c.get("source", [])) for c in cells)
            yield rel, text


def _sections(spec: str) -> list[str]:
    """'4-5, 8' -> ['4', '5', '8']; '5.2' -> ['5.2']; '1, 3 and 4' -> ['1', '3', '4']."""
    out = []
    for part in re.split(r"\s*(?:,|and)\s*", spec.strip()):
        ends = re.split(r"\s*(?:-|to)\s*", part)
        if len(ends) == 2 and "." not in part:
            out += [str(k) for k in range(int(ends[0]), int(ends[1]) + 1)]
        else:
            out += ends
    return out


def _headings(doc: str) -> set[str]:
    return set(HEADING.findall(doc))


def _readme_table_citations(text: str) -> list[str]:
    """First-column section tokens ("s3", "s1-2") of a markdown table headed "theory.md"."""
    specs, in_table = [], False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and cells[0] == "theory.md":
            in_table = True
            continue
        if not line.lstrip().startswith("|"):
            in_table = False
        elif in_table:
            specs += re.findall(rf"\bs({_LIST})\b", cells[0])
    return specs


def _citations():
    """(file, cited section) for every section citation of theory.md in the repository."""
    found = []
    for rel, text in _sources():
        specs = CITATION.findall(text) + BARE.findall(text) + _readme_table_citations(text)
        found += [(rel, s) for spec in specs for s in _sections(spec)]
    return found


def test_citations_are_found():
    cited = {s for _, s in _citations()}
    # The repository cites every numbered section; if none is found the parser is broken.
    assert {"1", "2", "3", "4", "5", "6", "7", "8"} <= cited


def test_every_cited_section_is_a_heading():
    headings = _headings(_doc())
    missing = sorted({(rel, s) for rel, s in _citations() if s not in headings})
    assert not missing, (f"theory.md has no heading for these citations (file, section): "
                         f"{missing}; headings are {sorted(headings)}")


def test_sections_one_to_thirteen_in_order():
    top = [h for h in HEADING.findall(_doc()) if "." not in h]
    assert top == [str(k) for k in range(1, 14)]


def _check_table():
    """Rows of the section-5 table whose header is 'mu | rho | alpha | x* | y* | regime'."""
    lines = _doc().splitlines()
    start = next(i for i, line in enumerate(lines)
                 if re.fullmatch(r"\|\s*mu\s*\|\s*rho\s*\|\s*alpha\s*\|\s*x\*\s*\|\s*y\*\s*\|"
                                 r"\s*regime\s*\|", line.strip()))
    rows = []
    for line in lines[start + 2:]:
        if not line.strip().startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    assert rows, "the check-values table has no rows"
    return rows


def _close(text: str, value: float) -> bool:
    """Whether ``value`` rounds to ``text`` at the digits shown (inf and 0 exactly)."""
    if text == "inf":
        return math.isinf(value)
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(value - float(text)) <= 0.5 * 10.0 ** -decimals * (1 + 1e-9)


@pytest.mark.parametrize("row", _check_table(), ids=lambda r: "-".join(r[:3]))
def test_check_values_table(row):
    mu, rho, alpha = (float(c) for c in row[:3])
    x_text, y_text, regime = row[3:6]
    for method in ("closed_form", "numeric"):
        d = optimal_design(mu, rho, PowerLawNoise(alpha), method=method)
        assert _close(x_text, d.horizon), (method, row, d.horizon)
        assert _close(y_text, d.replay_ratio), (method, row, d.replay_ratio)
        assert d.regime == regime, (method, row, d.regime)


def _resolve(dotted: str):
    """Import the longest module prefix of ``dotted`` and walk the remaining attributes."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ModuleNotFoundError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_named_implementations_exist():
    names = sorted(set(DOTTED.findall(_doc())))
    assert len(names) > 40, names  # the document names the implementation of each formula
    assert EXPERIMENTS  # the studies' records, moved out of theory.md, name code as well
    for path in EXPERIMENTS:
        with open(path) as fh:
            names = sorted(set(names) | set(DOTTED.findall(fh.read())))
    missing = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name} ({exc})")
    assert not missing, f"theory.md names what does not exist: {missing}"
