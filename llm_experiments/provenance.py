"""Check from git history that each verdict judged a registration committed before its runs.

A pre-registered test is only a test if its predictions were fixed before the data that
judges them. ``judge`` writes into every verdict record the registration it read (path and
sha256 of its bytes). For each ``validation*.json`` under a results folder this finds the
first commit whose copy of that path has that sha256, and the first commit of the curves the
verdicts came from (``curves.jsonl`` beside the validation, or one folder up for
``interim/``), and passes when the registration's commit is an ancestor of the curves'.

``python -m llm_experiments.provenance [results]``: a table on the terminal; exit status 1
when some registration came after its runs or matches no commit, 0 otherwise. Validations
written before ``judge`` recorded the registration are listed as unchecked.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Provenance:
    """One validation file: its registration and the commits that fix the order.

    validation, registration, curves: paths relative to the repository root. reg_commit:
    first commit holding the judged bytes of the registration ('' = none). curves_commit:
    first commit of the curves ('' = not committed). status: 'ok', 'registered after the
    runs', 'registered with the runs' (one commit: no order to see), 'registration never
    committed', 'curves not committed' or 'unchecked' (no registration recorded)."""

    validation: str
    registration: str
    reg_commit: str
    curves: str
    curves_commit: str
    status: str


def _git(root: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, check=False)


def first_commit_with(root: str, path: str, sha256: str = "") -> str:
    """The oldest commit that holds ``path`` (with bytes of that sha256, when given); ''."""
    for commit in reversed(_git(root, "log", "--format=%H", "--", path).stdout.split()):
        commit = commit.decode()
        if not sha256:
            return commit
        blob = _git(root, "show", f"{commit}:{path}")
        if blob.returncode == 0 and hashlib.sha256(blob.stdout).hexdigest() == sha256:
            return commit
    return ""


def check(root: str, validation: str) -> Provenance:
    """The provenance of one validation file (path relative to ``root``)."""
    with open(os.path.join(root, validation)) as fh:
        records = json.load(fh)
    folder = os.path.dirname(validation)
    if os.path.basename(folder) == "interim":
        folder = os.path.dirname(folder)
    curves = os.path.join(folder, "curves.jsonl")
    curves_commit = first_commit_with(root, curves)
    if not (isinstance(records, list) and all(isinstance(r, dict) for r in records)):
        raise ValueError(f"{validation} is not a list of verdict records (judge's output)")
    regs = {json.dumps(r.get("registration"), sort_keys=True) for r in records}
    reg = json.loads(regs.pop()) if len(regs) == 1 else None
    if not reg or not reg.get("sha256"):
        return Provenance(validation, "", "", curves, curves_commit, "unchecked")
    path = reg["path"]
    if os.path.isabs(path):
        path = os.path.relpath(path, os.path.abspath(root))
    reg_commit = first_commit_with(root, path, reg["sha256"])
    if not reg_commit:
        status = "registration never committed"
    elif not curves_commit:
        status = "curves not committed"
    elif reg_commit == curves_commit:
        status = "registered with the runs"
    elif _git(root, "merge-base", "--is-ancestor", reg_commit, curves_commit).returncode == 0:
        status = "ok"
    else:
        status = "registered after the runs"
    return Provenance(validation, path, reg_commit, curves, curves_commit, status)


def check_all(root: str, results: str = "results") -> list[Provenance]:
    """``check`` for every ``validation*.json`` under ``root/results`` (and its
    ``interim/`` folders), sorted by path."""
    found = glob.glob(os.path.join(root, results, "**", "validation*.json"), recursive=True)
    return [check(root, os.path.relpath(p, root)) for p in sorted(found)]


def main(argv=None) -> int:
    """The command line (module docstring); returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m llm_experiments.provenance",
                                description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", default="results",
                   help="results folder inside the repository (default results)")
    p.add_argument("--root", default=".", help="repository root (default .)")
    a = p.parse_args(argv)
    rows = check_all(a.root, a.results)
    for r in rows:
        print(f"{r.status:>30s}  {r.validation}  registration {r.registration or '-'} "
              f"@{r.reg_commit[:7] or '-'}  curves @{r.curves_commit[:7] or '-'}")
    bad = [r for r in rows if r.status not in ("ok", "unchecked")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
