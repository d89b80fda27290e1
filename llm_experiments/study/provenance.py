"""Check from git history that each verdict judged a registration committed before its runs.

A pre-registered test is only a test if its predictions were fixed before the data that
judges them. ``judge`` writes into every verdict record the registration it read and the
curves files it read (path and sha256 of the bytes of each). For each ``validation*.json``
under a results folder this finds the first commit whose copy of the registration's path has
that sha256, and for each curves file the first commit of its path (its earliest runs), and
passes when the registration's commit is an ancestor of every curves file's. Records written
before ``judge`` named its curves are checked against ``curves.jsonl`` beside the validation
(one folder up for ``interim/``).

What each registration preceded is said, not only whether it preceded the runs: a
registration committed after its curves existed but before its verdict (the validation's
first commit), such as a window of an existing sweep scored later (``window_predict``), is
"registered after the runs, before the verdict": a prediction made after the curves existed,
not a test blind to them. It passes; one committed with or after its verdict fails.

``python -m llm_experiments.study.provenance [results]``: a table on the terminal, one line per
validation and one per curves file, then a summary: how many validations have each status,
what it means, and whether the check passed. Exit status 1 when some registration came after
its verdict (or with its runs), matches no commit of the repository, or judged curves that were
never committed; 0 otherwise. Validations written before ``judge`` recorded the registration,
or whose registration lies outside the repository (a development check's), are listed as
unchecked.
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
AFTER_RUNS = "registered after the runs, before the verdict"
CURVES_STATUSES = ("registered after the runs", "curves not committed",
                   "registered with the runs", AFTER_RUNS, "ok")
UNCHECKED, OUTSIDE = "unchecked", "registration outside the repository"
# What each status of a validation says, for the summary, and whether it passes the check.
MEANING = {"ok": ("registered before every run it judges", True),
           AFTER_RUNS: ("registered after its runs but before its verdict: a prediction "
                        "made after the curves existed, not a blind test", True),
           UNCHECKED: ("unchecked: judged before judge recorded the registration", True),
           OUTSIDE: ("unchecked: the registration lies outside the repository (a "
                     "development check's)", True),
           "registered after the runs": ("registered after its runs and not before its "
                                         "verdict", False),
           "registered with the runs": ("registered in the same commit as its runs: no "
                                        "order to see", False),
           "curves not committed": ("the curves it judged were never committed", False),
           "registration never committed": ("the judged registration matches no commit",
                                            False)}


@dataclass(frozen=True)
class CurvesOrder:
    """One curves file a validation judged. path: relative to the repository root. commit:
    first commit of the path, i.e. of its earliest runs ('' = not committed). status: one of
    ``CURVES_STATUSES`` ('registered with the runs': one commit, no order to see; AFTER_RUNS:
    after this file's first commit, before the validation's)."""

    path: str
    commit: str
    status: str


@dataclass(frozen=True)
class Provenance:
    """One validation file: its registration and the commits that fix the order.

    validation, registration: paths relative to the repository root. reg_commit: first commit
    holding the judged bytes of the registration ('' = none). curves: the curves files judged,
    each with its own order. status: UNCHECKED (no registration recorded), OUTSIDE (its path
    leaves the repository), 'registration never committed', or else the worst of the curves
    files' statuses (``MEANING`` says what each means)."""

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


def _before(root: str, first: str, then: str) -> bool:
    """Whether commit ``first`` is a strict ancestor of commit ``then`` ('' = none)."""
    return bool(then) and first != then and \
        _git(root, "merge-base", "--is-ancestor", first, then).returncode == 0


def _order(root: str, reg_commit: str, curves: str, verdict_commit: str) -> CurvesOrder:
    commit = first_commit_with(root, curves)
    if not reg_commit:
        return CurvesOrder(path=curves, commit=commit, status="")
    if not commit:
        status = "curves not committed"
    elif reg_commit == commit:
        status = "registered with the runs"
    elif _before(root, reg_commit, commit):
        status = "ok"
    elif _before(root, reg_commit, verdict_commit):
        status = AFTER_RUNS
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
    outside = path.split(os.sep)[0] == os.pardir
    reg_commit = first_commit_with(root, path, reg["sha256"]) if path and not outside else ""
    verdict_commit = first_commit_with(root, validation)
    curves = tuple(_order(root, reg_commit, c, verdict_commit)
                   for c in _judged_curves(root, records, validation))
    if not path:
        status = UNCHECKED
    elif outside:
        status = OUTSIDE
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
        print(f"{r.status:>45s}  {r.validation}  registration {r.registration or '-'} "
              f"@{r.reg_commit[:7] or '-'}")
        for c in r.curves:
            print(f"{c.status or '-':>51s}    curves {c.path} @{c.commit[:7] or '-'}")
    lines, passed = summary(rows)
    print("\n".join(lines))
    return 0 if passed else 1


def summary(rows: list[Provenance]) -> tuple[list[str], bool]:
    """(lines, passed): how many validations have each status and what it means, and a last
    line that says whether the check passed (no status whose ``MEANING`` fails)."""
    counts = {s: sum(r.status == s for r in rows) for s in MEANING}
    lines = [f"{len(rows)} validations:"] + [
        f"  {n:3d} {'pass' if MEANING[s][1] else 'FAIL'}  {MEANING[s][0]}"
        for s, n in counts.items() if n]
    failed = sum(n for s, n in counts.items() if not MEANING[s][1])
    lines.append(f"FAILED: {failed} validation(s) above marked FAIL" if failed else
                 "passed: every checked registration precedes its verdict (the lines above "
                 "say which also precede their runs)")
    return lines, not failed


if __name__ == "__main__":
    raise SystemExit(main())
