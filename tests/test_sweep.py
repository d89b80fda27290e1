import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from llm_experiments.study.sweep import SweepCounts, expand, load_spec, run_id, run_sweep
from sweep_processes import kill_processes_naming, kill_recorded, runs_under_way, survivors

FAKE = [sys.executable, str(Path(__file__).with_name("fake_run.py"))]


def write_spec(tmp_path, **extra):
    spec = {"config": "cpu_tiny", "command": FAKE, "set": {"train.steps": 4},
            "cells": [{"buffer.horizon": 1}, {"buffer.horizon": 4}],
            "grid": {"seed": [0, 1, 2]}, **extra}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_expand_and_ids(tmp_path):
    runs = expand(load_spec(write_spec(tmp_path)))
    assert len(runs) == 6
    assert len({r.run_id for r in runs}) == 6
    assert runs[0].overrides == {"train.steps": 4, "buffer.horizon": 1, "seed": 0}
    assert run_id({"a.b": 1, "c": 2}) == run_id({"c": 2, "a.b": 1})


@pytest.mark.parametrize("bad, needle", [
    ({"config": 3}, "config"),
    ({"grid": {"seed": []}}, "grid.seed"),
    ({"cells": "x"}, "cells"),
    ({"bogus": 1}, "unknown"),
])
def test_bad_spec(tmp_path, bad, needle):
    with pytest.raises(ValueError, match=needle):
        load_spec(write_spec(tmp_path, **bad))


def test_sweep_runs_all_and_skips_finished(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    out = tmp_path / "sweep"
    counts = run_sweep(spec, str(out), workers=2, env={"FAKE_SLEEP": "0"}, progress=False)
    assert counts == SweepCounts(total=6, skipped=0, compacted=0, finished=6, failed=0)
    rows = [json.loads(line) for line in open(out / "results.jsonl")]
    assert len(rows) == 6 and {r["set.seed"] for r in rows} == {0, 1, 2}
    assert (out / "results.csv").read_text().startswith("run_id,")
    again = run_sweep(spec, str(out), workers=2, progress=False)
    assert again.skipped == 6 and again.finished == 0


def test_failures_are_recorded_and_retried(tmp_path):
    spec = load_spec(write_spec(tmp_path, cells=[{"fail": 1}], grid={"seed": [0]}))
    out = tmp_path / "sweep"
    counts = run_sweep(spec, str(out), env={"FAKE_SLEEP": "0"}, progress=False)
    assert counts.failed == 1
    assert json.loads((out / "failures.jsonl").read_text())["returncode"] == 3
    assert run_sweep(spec, str(out), env={"FAKE_SLEEP": "0"}, progress=False).failed == 1


def test_kill_mid_sweep_then_resume_loses_and_redoes_nothing(tmp_path):
    spec_path = write_spec(tmp_path)
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-c",
           "import sys; from llm_experiments.study.sweep import main; sys.exit(main(sys.argv[1:]))",
           "--spec", str(spec_path), "--out", str(out)]
    env = {**os.environ, "FAKE_SLEEP": "0.2", "FAKE_STEPS": "4"}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    runs_dir = out / "runs"
    # wait until at least one run finished and another is part-way through
    while time.time() < deadline:
        done = list(runs_dir.glob("*/summary.json")) if runs_dir.exists() else []
        partial = [p for p in runs_dir.glob("*/metrics.jsonl")
                   if not (p.parent / "summary.json").exists()] if runs_dir.exists() else []
        if done and partial and partial[0].read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    kill_processes_naming(out)  # a crash takes the runs too (each in a session of its own)
    proc.wait()
    finished_before = {p.parent.name for p in runs_dir.glob("*/summary.json")}
    assert finished_before and len(finished_before) < 6
    counts = run_sweep(load_spec(spec_path), str(out), env={"FAKE_SLEEP": "0"}, progress=False)
    assert counts.skipped == len(finished_before) and counts.failed == 0
    for run_dir in runs_dir.iterdir():
        steps = [json.loads(line)["step"] for line in open(run_dir / "metrics.jsonl")]
        assert steps == [1, 2, 3, 4]  # nothing lost, nothing duplicated
        invocations = (run_dir / "invocations.txt").read_text().split()
        if run_dir.name in finished_before:
            assert invocations == ["fresh"]  # not redone
    assert len([json.loads(line) for line in open(out / "results.jsonl")]) == 6


def _finish_like_the_harness(run_dir: Path, seed: int) -> None:
    """Give a fake run folder the files ``compact_run`` reads (config, eval record)."""
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"schedule": {"batch_size": 4}}))
    (run_dir / "metrics.jsonl").write_text(json.dumps(
        {"step": 0, "samples_generated": 0, "samples_consumed": 0, "eval_accuracy": seed / 10})
        + "\n")


def _compacted_seed0_sweep(tmp_path, name: str) -> Path:
    """Seed 0 of the default spec run into ``tmp_path/name`` and compacted to
    ``tmp_path/name.jsonl`` (2 runs): an earlier machine's committed curves."""
    from llm_experiments.study.results import compact_sweep

    run_sweep(load_spec(write_spec(tmp_path, grid={"seed": [0]})), str(tmp_path / name),
              env={"FAKE_SLEEP": "0"}, progress=False)
    for run_dir in (tmp_path / name / "runs").iterdir():
        _finish_like_the_harness(run_dir, 0)
    curves = tmp_path / f"{name}.jsonl"
    assert compact_sweep(str(tmp_path / name), str(curves)) == 2
    return curves


def test_sweep_continues_from_compacted_curves_on_another_machine(tmp_path):
    from llm_experiments.study.results import compact_sweep, load_runs

    curves = _compacted_seed0_sweep(tmp_path, "old_machine")

    # The new machine has only the committed curves; the full spec has seeds 0 and 1.
    spec = load_spec(write_spec(tmp_path, grid={"seed": [0, 1]}))
    new = tmp_path / "new_machine"
    counts = run_sweep(spec, str(new), env={"FAKE_SLEEP": "0"}, progress=False,
                       done_in=(str(curves),))
    assert counts == SweepCounts(total=4, skipped=2, compacted=2, finished=2, failed=0)
    assert {d.name for d in (new / "runs").iterdir()} == {
        r.run_id for r in expand(spec) if r.overrides["seed"] == 1}
    for run_dir in (new / "runs").iterdir():
        _finish_like_the_harness(run_dir, 1)
    assert compact_sweep(str(new), str(curves), keep=[str(curves)]) == 4
    runs = load_runs(str(curves))
    assert sorted(r.settings["seed"] for r in runs) == [0, 0, 1, 1]
    # a run in both the kept file and the folder is taken from the folder, once
    for run_dir in (new / "runs").iterdir():
        _finish_like_the_harness(run_dir, 5)
    assert compact_sweep(str(new), str(curves), keep=[str(curves)]) == 4
    assert sorted(r.eval["eval_accuracy"][0] for r in load_runs(str(curves))) == [0, 0, .5, .5]
    with pytest.raises(ValueError, match="done_in"):
        run_sweep(spec, str(new), progress=False, done_in=(str(tmp_path / "typo.jsonl"),))


def test_a_machine_with_another_warm_start_stops_instead_of_joining_the_grid(tmp_path):
    """The compacted runs started from a policy with step-0 accuracy 0.5; the fake runs here
    record none, as a machine that trained another warm start would record another."""
    spec = load_spec(write_spec(tmp_path, grid={"run.seed": [0, 1]}))
    first = [r for r in expand(spec) if r.overrides["run.seed"] == 0]
    curves = tmp_path / "curves.jsonl"
    curves.write_text("".join(json.dumps(
        {"run_id": r.run_id, "settings": r.overrides,
         "summary": {"warm_start_accuracy": 0.5}}) + "\n" for r in first))
    out = tmp_path / "sweep"
    counts = run_sweep(spec, str(out), env={"FAKE_SLEEP": "0"}, progress=False,
                       done_in=(str(curves),))
    assert counts.finished == 0 and counts.failed == 1
    failure = json.loads((out / "failures.jsonl").read_text())
    assert "warm start differs" in failure["reason"]
    assert [d.name.endswith(".other-warm-start") for d in (out / "runs").iterdir()] == [True]


def test_a_grid_reuses_the_identical_runs_of_another_sweep(tmp_path):
    """A new grid sharing some runs (same overrides, hence same ids) with an earlier sweep
    skips them (--done-in) and, compacted with ``grid_only``, takes those and no others."""
    from llm_experiments.study.results import compact_sweep, load_runs

    old_curves = _compacted_seed0_sweep(tmp_path, "earlier")  # horizons 1 and 4

    spec = load_spec(write_spec(tmp_path, grid={"seed": [0]},
                                cells=[{"buffer.horizon": 4}, {"buffer.horizon": 16}]))
    new = tmp_path / "new"
    counts = run_sweep(spec, str(new), env={"FAKE_SLEEP": "0"}, progress=False,
                       done_in=(str(old_curves),))
    assert (counts.compacted, counts.finished) == (1, 1)
    for run_dir in (new / "runs").iterdir():
        _finish_like_the_harness(run_dir, 0)
    curves = tmp_path / "curves.jsonl"
    assert compact_sweep(str(new), str(curves), keep=[str(old_curves)], grid_only=True) == 2
    assert sorted(r.settings["buffer.horizon"] for r in load_runs(str(curves))) == [4, 16]
    assert compact_sweep(str(new), str(curves), keep=[str(old_curves)]) == 3


def test_compacted_curves_gzip_reproducibly_and_every_reader_takes_them(tmp_path):
    """A ``.gz`` --out is compressed, the same text gives the same bytes (its committed sha256
    names its content), and done_in, --keep and load_runs read it like the plain file."""
    from llm_experiments.study.results import compact_sweep, load_runs

    plain = _compacted_seed0_sweep(tmp_path, "earlier")
    packed = tmp_path / "curves.jsonl.gz"
    assert compact_sweep(str(tmp_path / "earlier"), str(packed)) == 2
    assert packed.read_bytes()[:2] == b"\x1f\x8b"  # the gzip magic
    first = packed.read_bytes()
    assert compact_sweep(str(tmp_path / "earlier"), str(packed)) == 2
    assert packed.read_bytes() == first
    runs = lambda path: sorted((r.run_id, r.eval["eval_accuracy"][0]) for r in load_runs(path))
    assert runs(str(packed)) == runs(str(plain))
    # a new machine continues from the compressed file and keeps its runs
    spec = load_spec(write_spec(tmp_path, grid={"seed": [0, 1]}))
    new = tmp_path / "new_machine"
    counts = run_sweep(spec, str(new), env={"FAKE_SLEEP": "0"}, progress=False,
                       done_in=(str(packed),))
    assert counts.skipped == 2 and counts.finished == 2
    for run_dir in (new / "runs").iterdir():
        _finish_like_the_harness(run_dir, 1)
    assert compact_sweep(str(new), str(packed), keep=[str(packed)]) == 4
    assert sorted(r.settings["seed"] for r in load_runs(str(packed))) == [0, 0, 1, 1]


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_sweep_and_its_runs_and_a_rerun_finishes(tmp_path, signum, status):
    """SIGTERM / SIGINT to a sweep: it stops every run it started (and the runs' own
    subprocesses), rewrites the results of the runs that finished, exits 128 + signal; the
    next call resumes the interrupted runs and finishes the rest."""
    spec_path = write_spec(tmp_path, cells=[{"buffer.horizon": 1},
                                            {"buffer.horizon": 4, "slow": 1}])
    out, pid_dir = tmp_path / "sweep", tmp_path / "pids"
    pid_dir.mkdir()
    # SIGINT as in a terminal's foreground (a runner in the background may pass it ignored)
    cmd = [sys.executable, "-c",
           "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
           "from llm_experiments.study.sweep import main; sys.exit(main(sys.argv[1:]))",
           "--spec", str(spec_path), "--out", str(out), "--workers", "2"]
    # the slow runs would take minutes: the sweep must stop them, not wait for them
    env = {**os.environ, "FAKE_SLEEP": "0.1", "FAKE_SLOW_SLEEP": "30", "FAKE_STEPS": "4",
           "FAKE_HELPER": "1", "FAKE_PID_DIR": str(pid_dir)}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        runs_under_way(out / "runs", finished=1, deadline=time.time() + 60)
        signalled = time.time()
        proc.send_signal(signum)
        assert proc.wait(timeout=8) == status, proc.stderr.read()
        assert time.time() - signalled < 5
        assert survivors(pid_dir) == []
    finally:  # nothing left behind if the sweep failed to stop its runs
        if proc.poll() is None:
            proc.kill()
        kill_recorded(pid_dir)
        kill_processes_naming(out)
        proc.wait()
    assert "rerun" in proc.stderr.read()
    finished = {p.parent.name for p in (out / "runs").glob("*/summary.json")}
    assert 1 <= len(finished) < 6
    assert {json.loads(line)["run_id"] for line in open(out / "results.jsonl")} == finished
    assert (out / "failures.jsonl").read_text() == ""  # interrupted is not failed
    counts = run_sweep(load_spec(spec_path), str(out), env={"FAKE_SLEEP": "0"}, progress=False)
    assert counts == SweepCounts(total=6, skipped=len(finished), compacted=0,
                                 finished=6 - len(finished), failed=0)
    for run_dir in (out / "runs").iterdir():
        steps = [json.loads(line)["step"] for line in open(run_dir / "metrics.jsonl")]
        assert steps == [1, 2, 3, 4]
        invocations = (run_dir / "invocations.txt").read_text().split()
        assert invocations[0] == "fresh" and set(invocations[1:]) <= {"resume"}
    assert len((out / "results.jsonl").read_text().splitlines()) == 6


def test_a_run_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    """In process: a run (and its helper) ignoring SIGTERM gets SIGKILL ``stop_grace``
    seconds after the sweep was signalled; ``run_sweep`` raises ``SweepInterrupted``."""
    from llm_experiments.study.sweep import SweepInterrupted

    spec = load_spec(write_spec(tmp_path))
    out, pid_dir = tmp_path / "sweep", tmp_path / "pids"
    pid_dir.mkdir()

    def signal_when_under_way():
        runs_under_way(out / "runs", finished=0, deadline=time.time() + 30)
        times.append(time.time())
        os.kill(os.getpid(), signal.SIGTERM)

    times, handler = [], signal.getsignal(signal.SIGTERM)
    signaller = threading.Thread(target=signal_when_under_way, daemon=True)
    signaller.start()
    try:
        with pytest.raises(SweepInterrupted) as stopped:
            run_sweep(spec, str(out), workers=2, progress=False, stop_grace=0.5,
                      env={"FAKE_SLEEP": "0.2", "FAKE_STEPS": "50", "FAKE_HELPER": "1",
                           "FAKE_IGNORE_TERM": "1", "FAKE_PID_DIR": str(pid_dir)})
        took = time.time() - times[0]
        assert stopped.value.code == 143 and stopped.value.signum == signal.SIGTERM
        assert 0.5 <= took < 3
        assert survivors(pid_dir) == []
    finally:
        kill_recorded(pid_dir)
    assert signal.getsignal(signal.SIGTERM) == handler  # put back
    assert not list((out / "runs").glob("*/summary.json"))


def test_a_ray_task_stops_its_run_when_the_stop_file_appears(tmp_path):
    """The sweep's stop file stops a run even where Ray's cancel never arrives: the task's
    poll sees it within a second and stops the run's process (``_ray_call``, called here
    without Ray)."""
    import sys
    import threading
    import time

    from llm_experiments.study.sweep import _ray_call, _stop_file
    log = tmp_path / "run.log"
    result = []
    started = time.time()
    worker = threading.Thread(target=lambda: result.append(_ray_call(
        [sys.executable, "-c", "import time; time.sleep(60)"], str(log), {}, 0.5)))
    worker.start()
    time.sleep(1.0)
    open(_stop_file(log), "w").close()
    worker.join(timeout=20)
    assert not worker.is_alive() and result and result[0] != 0
    assert time.time() - started < 20
