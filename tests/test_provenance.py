"""The registration-before-runs check reads the order from a real git history."""

import hashlib
import json
import os
import subprocess

import pytest

from llm_experiments.study.provenance import check, main

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _commit(repo, files: dict, message: str):
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=GIT_ENV)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", message], check=True, env=GIT_ENV)


def _validation(registration_text: str, curves=None) -> str:
    sha = hashlib.sha256(registration_text.encode()).hexdigest()
    rec = {"registration": {"path": "results/s/prediction.json", "sha256": sha}}
    if curves:
        rec["curves"] = [{"path": c, "sha256": "not read by the check"} for c in curves]
    return json.dumps([rec, rec])


@pytest.fixture
def repo(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=GIT_ENV)
    return tmp_path


REG = '{"predictions": "x=16"}'
CURVES = "run 1\n"


def test_registration_before_the_runs_passes(repo):
    _commit(repo, {"results/s/prediction.json": REG}, "register")
    _commit(repo, {"results/s/curves.jsonl": CURVES}, "runs")
    _commit(repo, {"results/s/validation.json": _validation(REG)}, "judge")
    assert check(str(repo), "results/s/validation.json").status == "ok"
    assert main(["--root", str(repo)]) == 0


def test_registration_after_the_runs_but_before_the_verdict_passes_saying_so(repo, capsys):
    """Issue 38: the window predictions, registered after the curves they score and before
    their verdicts, made the README's check exit 1 with no summary. They pass, and the
    summary says what they preceded: the verdict, not the runs."""
    _commit(repo, {"results/s/curves.jsonl": CURVES}, "runs")
    _commit(repo, {"results/s/prediction.json": REG}, "register late")
    _commit(repo, {"results/s/interim/validation.json": _validation(REG)}, "judge")
    p = check(str(repo), "results/s/interim/validation.json")
    assert p.status == "registered after the runs, before the verdict"
    assert [c.path for c in p.curves] == [os.path.join("results", "s", "curves.jsonl")]
    assert main(["--root", str(repo)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [
        "1 validations:",
        "    1 pass  registered after its runs but before its verdict: a prediction made "
        "after the curves existed, not a blind test",
        "passed: every checked registration precedes its verdict (the lines above say which "
        "also precede their runs)"]


def test_registration_after_the_verdict_fails(repo, capsys):
    _commit(repo, {"results/s/curves.jsonl": CURVES}, "runs")
    _commit(repo, {"results/s/validation.json": _validation(REG)}, "judge")
    _commit(repo, {"results/s/prediction.json": REG}, "register after the verdict")
    assert check(str(repo), "results/s/validation.json").status == "registered after the runs"
    assert main(["--root", str(repo)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == \
        "FAILED: 1 validation(s) above marked FAIL"


def test_a_registration_outside_the_repository_is_unchecked(repo):
    """A development check judged against a registration in /tmp: nothing to order."""
    rec = [{"registration": {"path": "../../tmp/dev/prediction.json", "sha256": "0" * 64}}]
    _commit(repo, {"results/s/curves.jsonl": CURVES,
                   "results/s/validation.json": json.dumps(rec)}, "dev check")
    assert check(str(repo), "results/s/validation.json").status == \
        "registration outside the repository"
    assert main(["--root", str(repo)]) == 0


def test_a_registration_edited_after_the_runs_matches_no_earlier_commit(repo):
    """The judged bytes are the later edit: the early commit of the same path is not it."""
    _commit(repo, {"results/s/prediction.json": REG}, "register")
    _commit(repo, {"results/s/curves.jsonl": CURVES}, "runs")
    edited = REG.replace("16", "64")
    _commit(repo, {"results/s/prediction.json": edited,
                   "results/s/validation.json": _validation(edited)}, "edit and judge")
    assert check(str(repo), "results/s/validation.json").status == "registered after the runs"
    _commit(repo, {"results/s/validation.json": _validation('{"never": 1}')}, "judge other")
    assert check(str(repo), "results/s/validation.json").status == \
        "registration never committed"


def test_a_validation_without_a_recorded_registration_is_unchecked(repo):
    _commit(repo, {"results/s/curves.jsonl": CURVES,
                   "results/s/validation.json": json.dumps([{"mu": 2.0}])}, "old judge")
    assert check(str(repo), "results/s/validation.json").status == "unchecked"
    assert main(["--root", str(repo)]) == 0


def test_a_registration_in_the_same_commit_as_the_runs_shows_no_order(repo):
    _commit(repo, {"results/s/prediction.json": REG, "results/s/curves.jsonl": CURVES,
                   "results/s/validation.json": _validation(REG)}, "all at once")
    assert check(str(repo), "results/s/validation.json").status == "registered with the runs"
    assert main(["--root", str(repo)]) == 1


def test_each_judged_curves_file_is_ordered_and_the_worst_decides(repo):
    """A grid judged with its extension: registered between the two, it precedes the
    extension's runs, and the main grid's only through its verdict; the validation says
    the latter."""
    _commit(repo, {"results/s/curves.jsonl": CURVES}, "main grid's runs")
    _commit(repo, {"results/s/prediction.json": REG}, "register")
    _commit(repo, {"results/s/curves_ext.jsonl": CURVES}, "extension's runs")
    both = ["results/s/curves.jsonl", str(repo / "results/s/curves_ext.jsonl")]
    _commit(repo, {"results/s/validation.json": _validation(REG, both)}, "judge")
    p = check(str(repo), "results/s/validation.json")
    assert [(c.path, c.status) for c in p.curves] == [
        ("results/s/curves.jsonl", "registered after the runs, before the verdict"),
        ("results/s/curves_ext.jsonl", "ok")]
    assert p.status == "registered after the runs, before the verdict"
    _commit(repo, {"results/s/validation.json": _validation(REG, both[1:])}, "judge ext only")
    assert check(str(repo), "results/s/validation.json").status == "ok"


def test_curves_judged_in_the_sweep_folder_are_found_where_they_were_committed(repo):
    """verify judges sweeps/NAME/curves.jsonl (never committed); the copy beside the
    validation is the committed one."""
    _commit(repo, {"results/s/prediction.json": REG}, "register")
    _commit(repo, {"results/s/curves.jsonl": CURVES}, "runs")
    _commit(repo, {"results/s/validation.json": _validation(REG, ["sweeps/s/curves.jsonl"])},
            "judge")
    p = check(str(repo), "results/s/validation.json")
    assert [(c.path, c.status) for c in p.curves] == [("results/s/curves.jsonl", "ok")]
