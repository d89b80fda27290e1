"""Check from git history that each verdict judged a registration committed before its runs.

A pre-registered test is only a test if its predictions were fixed before the data that
judges them. ``judge`` writes into every verdict record the registration it read and the
curves files it read (path and sha256 of the bytes of each). For each ``validation*.json``
under a results folder this finds the first commit whose copy of the registration's path has
that sha256, and for each curves file the first commit of its path (its earliest runs), and
passes when the registration's commit is an ancestor of every curves file's. Records written
before ``judge`` named its curves are checked against ``curves.jsonl`` beside the validation
(one folder up for ``interim/``).

``python -m llm_experiments.study.provenance [results]``: a table on the terminal, one line per
validation and one per curves file; exit status 1 when some registration came after some of
its runs or matches no commit, 0 otherwise. Validations written before ``judge`` recorded the
registration are listed as unchecked.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass

from replaytheory.cli_input import BadInput, Parser, existing_dir, read_json


# Worst first: a validation's status is the worst of its curves files'.
CURVES_STATUSES = ("registered after the runs", "curves not committed",
                   "registered with the runs", "ok")


@dataclass(frozen=True)
class CurvesOrder:
    """One curves file a validation judged. path: relative to the repository root. commit:
    first commit of the path, i.e. of its earliest runs ('' = not committed). status: one of
    ``CURVES_STATUSES`` ('registered with the runs': one commit, no order to see)."""

    path: str
    commit: str
    status: str


@dataclass(frozen=True)
class Provenance:
    """One validation file: its registration and the commits that fix the order.

    validation, registration: paths relative to the repository root. reg_commit: first commit
    holding the judged bytes of the registration ('' = none). curves: the curves files judged,
    each with its own order. status: 'unchecked' (no registration recorded), 'registration
    never committed', or else the worst of the curves files' statuses."""

    validation: str
    registration: str
    reg_commit: str
    curves: tuple[CurvesOrder, ...]
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


def _relative(root: str, path: str) -> str:
    return os.path.relpath(path, os.path.abspath(root)) if os.path.isabs(path) else path


def _judged_curves(root: str, records: list[dict], validation: str) -> list[str]:
    """The curves files the records name, relative to ``root``. A file judged where it was
    made (``verify``'s sweep folder, never committed) is looked for under the same name beside
    the validation, where the README's workflow copies it."""
    folder = os.path.dirname(validation)
    if os.path.basename(folder) == "interim":
        folder = os.path.dirname(folder)
    named = {json.dumps(r.get("curves"), sort_keys=True) for r in records}
    listed = json.loads(named.pop()) if len(named) == 1 else None
    if not listed:
        return [os.path.join(folder, "curves.jsonl")]
    paths = []
    for c in listed:
        path = _relative(root, c["path"])
        beside = os.path.join(folder, os.path.basename(path))
        if not first_commit_with(root, path) and first_commit_with(root, beside):
            path = beside
        paths.append(path)
    return paths


def _order(root: str, reg_commit: str, curves: str) -> CurvesOrder:
    commit = first_commit_with(root, curves)
    if not reg_commit:
        return CurvesOrder(path=curves, commit=commit, status="")
    if not commit:
        status = "curves not committed"
    elif reg_commit == commit:
        status = "registered with the runs"
    elif _git(root, "merge-base", "--is-ancestor", reg_commit, commit).returncode == 0:
        status = "ok"
    else:
        status = "registered after the runs"
    return CurvesOrder(path=curves, commit=commit, status=status)


def check(root: str, validation: str) -> Provenance:
    """The provenance of one validation file (path relative to ``root``)."""
    records = read_json(os.path.join(root, validation), kind=list)
    if not all(isinstance(r, dict) for r in records):
        raise BadInput(f"{validation} is not a list of verdict records (judge's output)")
    regs = {json.dumps(r.get("registration"), sort_keys=True) for r in records}
    reg = json.loads(regs.pop()) if len(regs) == 1 else None
    path = _relative(root, reg["path"]) if reg and reg.get("sha256") else ""
    reg_commit = first_commit_with(root, path, reg["sha256"]) if path else ""
    curves = tuple(_order(root, reg_commit, c)
                   for c in _judged_curves(root, records, validation))
    if not path:
        status = "unchecked"
    elif not reg_commit:
        status = "registration never committed"
    else:
        status = min((c.status for c in curves), key=CURVES_STATUSES.index)
    return Provenance(validation=validation, registration=path, reg_commit=reg_commit,
                      curves=curves, status=status)


def check_all(root: str, results: str = "results") -> list[Provenance]:
    """``check`` for every ``validation*.json`` under ``root/results`` (and its
    ``interim/`` folders), sorted by path."""
    found = glob.glob(os.path.join(root, results, "**", "validation*.json"), recursive=True)
    return [check(root, os.path.relpath(p, root)) for p in sorted(found)]


def main(argv=None) -> int:
    """The command line (module docstring); returns the exit status."""
    p = Parser(prog="python -m llm_experiments.study.provenance",
               description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", default="results",
                   help="results folder inside the repository (default results)")
    p.add_argument("--root", type=existing_dir, default=".",
                   help="repository root (default .)")
    a = p.parse_args(argv)
    if _git(a.root, "rev-parse", "--git-dir").returncode != 0:
        p.error(f"argument --root: {a.root!r} is not in a git repository (the order of "
                f"commits is what is checked)")
    if not os.path.isdir(os.path.join(a.root, a.results)):
        p.error(f"argument results: no folder {a.results!r} under --root {a.root!r}")
    try:
        rows = check_all(a.root, a.results)
    except ValueError as exc:
        return p.report(exc)
    for r in rows:
        print(f"{r.status:>30s}  {r.validation}  registration {r.registration or '-'} "
              f"@{r.reg_commit[:7] or '-'}")
        for c in r.curves:
            print(f"{c.status or '-':>36s}    curves {c.path} @{c.commit[:7] or '-'}")
    bad = [r for r in rows if r.status not in ("ok", "unchecked")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
