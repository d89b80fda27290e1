"""Resumable sweeps: a grid of training runs, each one a ``llm_experiments run`` process.

``python -m llm_experiments sweep --spec SPEC.yaml --out sweeps/NAME [--workers K]
[--engine ray [--address A]]`` (``--engine ray``: each run a Ray task on a cluster, same files)

The spec (YAML)::

    config: cpu_tiny                  # the base config of every run
    set: {run.steps: 300}             # overrides shared by every run
    cells:                            # optional: joint settings, one run group each
      - {buffer.horizon: 1, schedule.replay_ratio: 1.0}
      - {buffer.horizon: 4, schedule.replay_ratio: 2.0}
    grid:                             # crossed with every cell (cartesian product)
      trainer.lr: [1.0e-4, 2.0e-4]
      run.seed: [0, 1, 2, 3, 4]

Every run gets a stable id from its overrides and a folder ``OUT/runs/<id>``. A run is done
when its ``summary.json`` exists: rerunning the sweep skips it. A folder without a summary is
an interrupted run and is continued with ``--resume`` (the harness checkpoints). Runs are
separate processes, so a crash or a kill loses at most the unsaved part of one run. After each
run the results table ``OUT/results.jsonl`` (and ``results.csv``) is rewritten atomically from
the finished runs; failures go to ``OUT/failures.jsonl`` and are retried on the next call.
``--done-in CURVES`` also skips the runs of committed compacted curves, so that a sweep begun
on a machine that is gone continues on another (compact with ``results --keep CURVES``).

SIGTERM, SIGINT (Ctrl-C) or SIGHUP stops the sweep and its runs: each run started (in a
session of its own, so a terminal's Ctrl-C reaches the sweep only) gets SIGTERM with its
subprocesses, and SIGKILL if still alive 10 s later; further signals meanwhile are ignored, and
so is a signal the sweep was started ignoring (``nohup`` keeps SIGHUP away). The results table
is rewritten from the finished runs, the stopped runs are neither finished nor failed (their
folders hold no summary and continue with ``--resume`` on the next call), and the sweep exits
with status 128 + the signal number (143 for SIGTERM, 130 for SIGINT). With ``--engine ray``
the sweep cancels its Ray tasks, and each task stops its run the same way. SIGKILL cannot be
caught: after ``kill -9`` of the sweep (or of its process group) its runs keep running to
their end; stop them before rerunning the sweep.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from replaytheory.cli_input import (Parser, existing_file, integer, missing_field, output_dir,
                                    read_jsonl)
from replaytheory.io import atomic_write, write_json

from ..config import load_config, read_yaml
from .results import CURVES, cell_of, same_warm_start, warm_start_of

DEFAULT_COMMAND = [sys.executable, "-m", "llm_experiments", "run"]
# Where the runs of a sweep execute (``--engine``): local subprocesses or Ray tasks.
SWEEP_ENGINES = ("local", "ray")
# The signals that stop a sweep and its runs (SIGHUP: the terminal closed, which no longer
# reaches the runs in their own sessions).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Seconds between the sweep's looks for a stop signal.
_POLL_S = 0.2


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: its id and the ``--set`` overrides that define it."""

    run_id: str
    overrides: dict


def _format_value(value) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def run_id(overrides: dict, shown=None) -> str:
    """A readable, stable id: short names and values of the ``shown`` keys (default all),
    plus a hash of the full overrides."""
    parts = []
    for key in sorted(overrides if shown is None else shown):
        short = key.rsplit(".", 1)[-1]
        parts.append(f"{short}={_format_value(overrides[key])}")
    slug = "_".join(parts).replace("/", "-").replace(" ", "")
    digest = hashlib.sha1(json.dumps(overrides, sort_keys=True).encode()).hexdigest()[:8]
    return f"{slug[:80]}_{digest}" if slug else digest


def load_spec(path: str) -> dict:
    """Read and check a sweep spec; raises ``ValueError`` naming what is wrong."""
    spec = read_yaml(path, "--spec")
    allowed = {"config", "set", "cells", "grid", "command", "name"}
    unknown = set(spec) - allowed
    if unknown:
        raise ValueError(f"spec has unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    if not isinstance(spec.get("config"), str):
        raise ValueError("spec.config must name a config (e.g. cpu_tiny) or a YAML path")
    for key in ("set", "grid"):
        if not isinstance(spec.get(key, {}), dict):
            raise ValueError(f"spec.{key} must be a mapping of config keys")
    for key, values in spec.get("grid", {}).items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"spec.grid.{key} must be a non-empty list of values")
    cells = spec.get("cells", [{}])
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells) or not cells:
        raise ValueError("spec.cells must be a non-empty list of mappings")
    return spec


def check_configs(spec: dict) -> None:
    """Every run's config of a spec run by the harness (no ``command`` of its own) resolved
    before any run starts; ``ValueError`` names the run and the bad key (a typo in the spec
    would otherwise fail every run, one process at a time)."""
    if "command" in spec:
        return
    for run in expand(spec):
        try:
            load_config(spec["config"], [f"{k}={_format_value(v)}"
                                         for k, v in run.overrides.items()])
        except ValueError as exc:
            raise ValueError(f"--spec run {run.run_id}: {exc}") from None


def expand(spec: dict) -> list[RunSpec]:
    """All runs of a spec, grid outermost (seed-major: a partial sweep stays balanced over
    cells), then the cells. Ids show the cell and grid keys, not the shared ``set``."""
    grid = spec.get("grid", {})
    keys = list(grid)
    runs, seen = [], set()
    for values in itertools.product(*(grid[k] for k in keys)):
        for cell in spec.get("cells", [{}]):
            point = dict(zip(keys, values))
            overrides = {**spec.get("set", {}), **cell, **point}
            rid = run_id(overrides, shown=[*cell, *point])
            if rid not in seen:
                seen.add(rid)
                runs.append(RunSpec(run_id=rid, overrides=overrides))
    return runs


def _command(spec: dict, run: RunSpec, run_dir: Path) -> list[str]:
    cmd = list(spec.get("command", DEFAULT_COMMAND))
    cmd += ["--config", spec["config"], "--out", str(run_dir)]
    for key, value in run.overrides.items():
        cmd += ["--set", f"{key}={_format_value(value)}"]
    if (run_dir / "config.yaml").exists():
        cmd.append("--resume")
    return cmd


def is_done(run_dir: Path) -> bool:
    return (run_dir / "summary.json").exists()


def compacted_runs(paths) -> dict[str, tuple[tuple, dict]]:
    """Runs held in compacted ``curves.jsonl`` files: run id -> (cell, the summary's warm-start
    fields). Raises ``ValueError`` for a path that is not a file (a mistyped ``--done-in`` must
    not silently rerun a whole sweep)."""
    runs = {}
    for path in paths:
        if not os.path.isfile(path):
            raise ValueError(f"done_in: {path!r} is not a file")
        for rec in read_jsonl(path, "--done-in"):
            try:
                runs[rec["run_id"]] = (cell_of(rec["settings"]),
                                       warm_start_of(rec.get("summary", {})))
            except KeyError as exc:
                raise missing_field(exc, path, "--done-in", CURVES) from None
    return runs


def foreign_warm_start(run: RunSpec, run_dir: Path, compacted: dict) -> str:
    """'' if the finished run started from the policy of the compacted runs of its cell (or
    there are none), else why not: a machine whose warm start differs must not add runs to a
    grid begun elsewhere (``models.cached_warm_start``)."""
    with open(run_dir / "summary.json") as fh:
        mine = json.load(fh)
    cell = cell_of(run.overrides)
    for rid, (other_cell, theirs) in compacted.items():
        if other_cell == cell:
            if same_warm_start(mine, theirs):
                return ""
            return (f"warm start differs from the compacted run {rid} of this cell "
                    f"(step-0 accuracy {mine.get('warm_start_accuracy')} vs "
                    f"{theirs.get('warm_start_accuracy')}): this machine trains another "
                    "initial policy; pin one with model.warm_start_path")
    return ""


def _flat_scalars(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, val in d.items():
        if isinstance(val, dict):
            continue
        if isinstance(val, (int, float, str, bool)) or val is None:
            out[prefix + k] = val
    return out


def collect(out_dir: Path, runs: list[RunSpec]) -> list[dict]:
    """One row per finished run: id, overrides (``set.<key>``) and scalar summary fields."""
    rows = []
    for run in runs:
        path = out_dir / "runs" / run.run_id / "summary.json"
        if not path.exists():
            continue
        with open(path) as fh:
            summary = json.load(fh)
        row = {"run_id": run.run_id}
        row.update({f"set.{k}": v for k, v in run.overrides.items()})
        row.update(_flat_scalars(summary))
        rows.append(row)
    return rows


def write_results(out_dir: Path, rows: list[dict]) -> None:
    """``results.jsonl`` and ``results.csv`` (all columns, blank where absent), atomically."""
    atomic_write(str(out_dir / "results.jsonl"),
                 lambda fh: fh.writelines(json.dumps(r) + "\n" for r in rows))
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(str(out_dir / "results.csv"), lambda fh: fh.write(buf.getvalue()))


class SweepInterrupted(SystemExit):
    """A sweep stopped by a signal after stopping its runs and rewriting its results table;
    ``code`` = 128 + ``signum`` (a caller that does not catch it exits with that status)."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


class _StopSignals:
    """The first of ``STOP_SIGNALS`` a sweep receives while armed (``signum``, None before).
    The handler only records it: the sweep's loops poll ``signum`` every ``_POLL_S`` seconds
    (an exception raised from a handler inside ``ray.wait`` would be swallowed by Ray), and
    later signals cannot cut short the stopping of the runs."""

    def __init__(self):
        self.signum: int | None = None
        self.previous: dict = {}

    def _record(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum

    def arm(self) -> None:
        """Install the handlers (again after ``ray.init``, which sets its own for SIGTERM),
        except for a signal the process was started ignoring (``nohup``, a shell's
        background job); nothing outside the main thread, where Python cannot set handlers."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            self.previous.setdefault(signum, signal.getsignal(signum))
            if self.previous[signum] != signal.SIG_IGN:
                signal.signal(signum, self._record)

    def disarm(self) -> None:
        """Put back the handlers found by the first ``arm``."""
        for signum, old in self.previous.items():
            signal.signal(signum, signal.SIG_DFL if old is None else old)
        self.previous.clear()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """``signum`` to the process group that ``proc`` leads (started with
    ``start_new_session``), if any process of it is left."""
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def stop_runs(procs, grace: float) -> None:
    """Stop run processes started in sessions of their own: SIGTERM to each one's process
    group, SIGKILL to a run still alive ``grace`` seconds (> 0) later, then SIGKILL to what
    is left of each group (subprocesses that ignored SIGTERM). Returns once every run has
    exited; a run killed this way resumes from its last checkpoint (the harness writes
    checkpoints, metrics and the summary so that a kill at any moment loses no finished step)."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)


def _start_run(cmd: list[str], log, env: dict) -> subprocess.Popen:
    """A run's process, output to ``log``, in a session of its own: a terminal's Ctrl-C
    reaches only the sweep, and the sweep can signal the run with its subprocesses."""
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


class _Children:
    """The run processes a local sweep has started and not yet seen exit; once ``stop`` is
    called no further run starts."""

    def __init__(self):
        self.running: set = set()
        self.stopping = False
        self.lock = threading.Lock()

    def call(self, cmd: list[str], log, env: dict) -> int | None:
        """Run ``cmd`` to its end; its return code, or None if the sweep is stopping."""
        with self.lock:  # so that stop() sees every run started
            if self.stopping:
                return None
            proc = _start_run(cmd, log, env)
            self.running.add(proc)
        try:
            return proc.wait()
        finally:
            with self.lock:
                self.running.discard(proc)

    def stop(self, grace: float) -> None:
        """Start no further run and stop the running ones (``stop_runs``)."""
        with self.lock:
            self.stopping = True
            procs = list(self.running)
        stop_runs(procs, grace)


def _on_local(todo: list[RunSpec], prepare, books: "_Books", workers: int, env: dict,
              signals: _StopSignals, grace: float) -> None:
    """Run ``todo`` as subprocesses, ``workers`` at a time, each booked by ``books`` as it
    ends. Once ``signals`` holds a signal no further run starts and the running ones are
    stopped (``stop_runs``) and booked neither finished nor failed. An error in a booking
    cancels the runs not started and goes on once the running ones ended."""
    children = _Children()

    def one(run: RunSpec):
        if books.stop:
            return
        cmd, log_path = prepare(run)
        with open(log_path, "a") as log:
            rc = children.call(cmd, log, env)
        if rc is not None and not (children.stopping and rc != 0):
            books.finish(run, cmd, log_path, rc)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, run) for run in todo]
        pending = set(futures)
        while pending and signals.signum is None:
            done, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_EXCEPTION)
            if any(f.exception() is not None for f in done):
                break
        for future in futures:
            future.cancel()  # the runs not started
        if signals.signum is not None:
            children.stop(grace)
    for future in futures:
        if not future.cancelled():
            future.result()


def _stop_file(log_path) -> str:
    """The file whose presence tells a Ray task to stop its run (next to the run's log)."""
    return f"{log_path}.stop"


def _ray_call(cmd: list[str], log_path: str, env: dict, grace: float) -> int:
    """A sweep run as a Ray task: the run's command in a subprocess, output to its log.
    ``ray.cancel`` (a KeyboardInterrupt here) or the run's stop file (``_stop_file``, written
    by the sweep when signalled: Ray delivers a cancel to a busy worker late, or not at all)
    stops the run (``stop_runs``)."""
    with open(log_path, "a") as log:
        proc = _start_run(cmd, log, env)
        try:
            while True:
                try:  # a timed wait polls, so that the cancel and the stop file are seen
                    return proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    if os.path.exists(_stop_file(log_path)):
                        stop_runs([proc], grace)
                        return proc.wait()
        except KeyboardInterrupt:
            stop_runs([proc], grace)
            raise


def _on_ray(todo: list[RunSpec], prepare, finish, address: str | None, env: dict,
            signals: _StopSignals, grace: float) -> None:
    """Run ``todo`` as Ray tasks (one CPU each) on the cluster at ``address`` (None: local);
    a run whose engine is Ray joins the same cluster. ``prepare(run)`` gives (command, log
    path), ``finish(run, command, log path, return code)`` books it. Once ``signals`` holds a
    signal the tasks not finished are cancelled (a running one stops its run, ``_ray_call``)
    and waited for, at most ``grace`` + 5 seconds."""
    import ray
    from ..engines.ray_engine import connect
    ours = connect(address)
    signals.arm()
    try:
        env = {**env, "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
               **{k: os.environ[k] for k in ("RAY_AUTH_TOKEN",) if k in os.environ}}
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_call)
        calls = {}
        for run in todo:
            cmd, log_path = prepare(run)
            with contextlib.suppress(FileNotFoundError):  # an earlier sweep's stop
                os.remove(_stop_file(log_path))
            calls[task.remote(cmd, str(log_path), env, grace)] = (run, cmd, log_path)
        while calls and signals.signum is None:
            done, _ = ray.wait(list(calls), num_returns=1, timeout=_POLL_S)
            for ref in done:
                run, cmd, log_path = calls.pop(ref)
                try:
                    rc = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the task's worker or node died
                    with open(log_path, "a") as log:
                        log.write(f"\nRay task failed: {exc}\n")
                    rc = -1
                finish(run, cmd, log_path, rc)
        for ref, (_, _, log_path) in calls.items():
            Path(_stop_file(log_path)).touch()
            ray.cancel(ref)
        if calls:
            ray.wait(list(calls), num_returns=len(calls), timeout=grace + 5)
    finally:
        if ours:
            ray.shutdown()


@dataclass(frozen=True)
class SweepCounts:
    """What one ``run_sweep`` call did, in runs (integers >= 0): ``total`` in the spec,
    ``skipped`` (every run not run now: done before), ``compacted`` (those of the skipped found
    only in ``done_in``, <= skipped), ``finished`` and ``failed`` now (finished + failed <=
    total - skipped; less when the sweep stopped early)."""

    total: int
    skipped: int
    compacted: int
    finished: int
    failed: int


@dataclass
class _Books:
    """What one ``run_sweep`` call books as its runs end: runs finished and failed, the results
    table, the failures, why no further run starts (``stop``, the local engine) and the
    progress bar."""

    out: Path
    runs: list
    compacted: dict
    bar: object
    finished: int = 0
    failed: int = 0
    failures: list = field(default_factory=list)
    stop: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def finish(self, run: RunSpec, cmd, log_path, rc: int) -> None:
        """Book a run that ended with return code ``rc``: finished (its results rewritten)
        or failed; one started from another warm start than the compacted runs of its cell
        is set aside as ``<id>.other-warm-start`` and stops the sweep."""
        run_dir = self.out / "runs" / run.run_id
        with self.lock:
            foreign = foreign_warm_start(run, run_dir, self.compacted) \
                if rc == 0 and is_done(run_dir) else ""
            if rc == 0 and is_done(run_dir) and not foreign:
                self.finished += 1
                write_results(self.out, collect(self.out, self.runs))
            else:
                self.failed += 1
                self.failures.append({"run_id": run.run_id, "returncode": rc,
                                      "log": str(log_path), "command": cmd,
                                      **({"reason": foreign} if foreign else {})})
            if foreign:  # set aside, not done: a machine with the grid's policy redoes it
                aside = run_dir.with_name(f"{run.run_id}.other-warm-start")
                shutil.rmtree(aside, ignore_errors=True)
                run_dir.rename(aside)
                self.stop.append(foreign)
                print(f"sweep: stopping: {run.run_id}: {foreign}", file=sys.stderr)
            self.bar.update(1)


def run_sweep(spec: dict, out_dir: str, *, workers: int = 1, env: dict | None = None,
              progress: bool = True, engine: str = "local", address: str | None = None,
              done_in: tuple[str, ...] = (), stop_grace: float = 10.0) -> SweepCounts:
    """Run every unfinished run of ``spec`` into ``out_dir``; returns what it did.

    Args:
        spec: a checked spec (``load_spec``). out_dir: the sweep folder.
        workers: runs at a time (integer >= 1) with engine "local"; each run should use one
            thread on a small machine. env: extra environment variables for the runs.
        engine: "local" (subprocesses, ``workers`` at a time) or "ray" (each run a Ray task of
            one CPU on the cluster at ``address``, None = ``$RAY_ADDRESS`` or a local one; the
            sweep folder must be on storage every node sees). Same result files either way.
        done_in: compacted ``curves.jsonl`` files (``results.compact_sweep``) whose runs count
            as done, so that a sweep continues on a machine that holds only the committed
            curves of an earlier session, not its run folders. A new run whose initial policy
            differs from the compacted runs of its cell (``results.same_warm_start``) is
            failed, its folder set aside as ``<id>.other-warm-start``, and (local engine) no
            further run starts.
        stop_grace: seconds (> 0) a run gets to exit after SIGTERM when a signal stops the
            sweep (``STOP_SIGNALS``, see the module docstring) before it gets SIGKILL.
    Returns:
        ``SweepCounts``: runs in the spec, skipped (not run now), compacted (skipped, found
        only in ``done_in``), finished and failed now.
    Raises:
        ``SweepInterrupted`` (a ``SystemExit``) after one of ``STOP_SIGNALS`` arrived in the
        main thread, once the runs are stopped and the results table rewritten.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if engine not in SWEEP_ENGINES:
        raise ValueError(f"engine must be one of {list(SWEEP_ENGINES)}, got {engine!r}")
    if address is not None and engine != "ray":
        raise ValueError("address needs engine='ray'")
    if not stop_grace > 0:
        raise ValueError(f"stop_grace must be > 0 seconds, got {stop_grace!r}")
    compacted = compacted_runs(done_in)  # a bad file is refused before the folder is made
    out = Path(out_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    runs = expand(spec)
    write_json(str(out / "sweep.json"), {"spec": spec, "runs": [r.__dict__ for r in runs]})
    in_folder = {r.run_id for r in runs if is_done(out / "runs" / r.run_id)}
    todo = [r for r in runs if r.run_id not in in_folder | compacted.keys()]
    run_env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}

    def prepare(run: RunSpec):
        run_dir = out / "runs" / run.run_id
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        log_path = out / "logs" / f"{run.run_id}.log"
        log_path.parent.mkdir(exist_ok=True)
        return _command(spec, run, run_dir), log_path

    skipped = len(runs) - len(todo)
    books = _Books(out=out, runs=runs, compacted=compacted,
                   bar=tqdm(total=len(runs), initial=skipped, desc="sweep", unit="run",
                            disable=not progress))
    signals = _StopSignals()
    signals.arm()
    try:
        if engine == "ray":
            _on_ray(todo, prepare, books.finish, address, run_env, signals, stop_grace)
        else:
            _on_local(todo, prepare, books, workers, run_env, signals, stop_grace)
    finally:
        books.bar.close()
        write_results(out, collect(out, runs))
        atomic_write(str(out / "failures.jsonl"),
                     lambda fh: fh.writelines(json.dumps(f) + "\n" for f in books.failures))
        signals.disarm()
    if signals.signum is not None:
        # Said here, so that every command that sweeps (sweep, predict, verify, demo) says it.
        print(f"sweep: stopped by {signal.Signals(signals.signum).name}: its runs were "
              f"stopped; finished runs in {out / 'results.jsonl'}; rerun to continue",
              file=sys.stderr)
        raise SweepInterrupted(signals.signum)
    return SweepCounts(total=len(runs), skipped=skipped,
                       compacted=len({r.run_id for r in runs} & compacted.keys() - in_folder),
                       finished=books.finished, failed=books.failed)


def main(argv=None) -> int:
    """Command line entry: ``sweep --spec SPEC.yaml --out DIR [--workers K]``."""
    p = Parser.from_doc("llm_experiments sweep", __doc__)
    p.add_argument("--spec", required=True, help="sweep spec (YAML)")
    p.add_argument("--out", type=output_dir, required=True,
                   help="sweep folder (created; rerun to continue)")
    p.add_argument("--workers", type=integer(1), default=1,
                   help="runs at a time (>= 1, default 1)")
    p.add_argument("--engine", choices=SWEEP_ENGINES, default="local",
                   help="local subprocesses (default) or one Ray task per run")
    p.add_argument("--address", default=None,
                   help="Ray cluster address for --engine ray (default $RAY_ADDRESS, else a "
                        "local cluster)")
    p.add_argument("--done-in", type=existing_file, nargs="+", default=[], metavar="CURVES",
                   help="compacted curves.jsonl whose runs count as done (continue a sweep "
                        "from the committed curves of an earlier machine)")
    args = p.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        check_configs(spec)
        counts = run_sweep(spec, args.out, workers=args.workers, engine=args.engine,
                           address=args.address, done_in=tuple(args.done_in))
    except ValueError as exc:
        return p.report(exc)
    except SweepInterrupted as exc:  # run_sweep said why
        return exc.code
    print(f"sweep: {counts.total} runs, {counts.skipped} already done "
          f"({counts.compacted} of them only in --done-in), "
          f"{counts.finished} finished now, {counts.failed} failed; results in "
          f"{Path(args.out) / 'results.jsonl'}")
    return 1 if counts.failed else 0
