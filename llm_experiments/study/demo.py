"""The main job: a small end-to-end paired experiment on the CPU (measured on 2 idle cores:
2 min 40 s, of which 1 min 40 s is the calibration run; the first run on a machine adds
about 1 min 10 s to warm-start the tiny model).

``python -m llm_experiments demo --out runs/demo [--mu 6.84]``

1. A calibration run (``cpu_tiny`` with a buffer of 16 steps and the probes of
   ``llm_experiments predict``) measures sigma(s), rho, the self-correlation c of one
   rollout's uses and the share of a gradient the clip keeps (``replaytheory.fit.calibrate``); its
   process first warm-starts the tiny model (cached, ``models.cache_dir``).
2. The calculator's answer for the given mu (default 6.84, the paper's Qwen3-0.6B cost ratio;
   the tiny model's own measured mu is reported too) and the run's length: the horizon and
   replay ratio measured on the committed grids (``replaytheory.advice``, theory.md section
   13), with the measured gain over on-policy that comes with it. Beside it, the staleness
   horizon x* and replay ratio y* the calibrated model alone would choose, with the model
   variant the probes support (sections 10.7, 10.11), and the model's own compute saving.
3. The advised configuration, on-policy training and two neighbours (half and twice the
   advised reuse) are trained, two at a time, as a resumable sweep.
4. ``summary.json`` holds the prediction, the fitted constants and each run's results, and
   ``python -m figures.demo OUT`` (run as a separate process) draws ``demo.png``/``demo.pdf``:
   accuracy against compute with the prediction marked.

The terminal shows one progress bar per phase (warm start, calibration run, prediction,
training runs); the runs' steps are read from their metrics logs. Every step is resumable:
rerun the same command after an interruption.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shlex
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from replaytheory import calibrate
from replaytheory import checks
from replaytheory.advice import Spread, advise
from replaytheory.stats.analysis import compute_to_target, mean_over_budget
from replaytheory.cli_input import Parser, integer, output_dir, real
from replaytheory.io import write_json

from .cells import kind
from .predict import calibration_spec
from .results import compact_sweep, load_runs
from .sweep import run_sweep
from .validation import load_probes

BASE = {"run.progress": False, "probe.every": 0}
# One calibration run as ``predict`` makes them, one seed: probes every 6 steps, so a buffer
# rollout is probed again 6 steps later (predict's second gap, 3 probes = 18 steps, outlives
# the 16-step buffer and finds no rows here); its noise table covers staleness up to 15
# steps, which bounds the predicted horizon.
CALIBRATION_STEPS, CALIBRATION_HORIZON = 60, 16.0
PHASES = ("warm start", "calibration run", "prediction", "training runs")
TARGET_SHARE = 0.8  # the target accuracy: this share of the way from the warm start to the best
# summary.json shows floats to 12 significant digits (0.416, not 0.41600000000000004); the
# returned summary keeps full precision.
SHOWN_DIGITS = 12


@dataclass(frozen=True)
class DemoRun:
    """One compared run. config: its label ("on-policy" or "x=.., y=.."). predicted: whether it
    is the advised (x, y), the calculator's answer. Accuracies in [0, 1]; final: at the last evaluation, tail: mean
    over the last quarter of the steps. compute: trainer updates spent at the summary's mu;
    compute_to_target: to first reach the target accuracy (inf if never). mean_accuracy: mean
    accuracy over compute in [0, C], C the smallest compute any compared run spent (the
    target-free score of theory.md section 8.3; NaN when not computed)."""

    config: str
    run_id: str
    predicted: bool
    final_accuracy: float
    tail_accuracy: float
    compute: float
    compute_to_target: float
    mean_accuracy: float = math.nan


@dataclass(frozen=True)
class DemoFit:
    """The fitted constants (theory.md sections 4 and 10.7): the noise exponent alpha (and
    whether the power law fits), the coupling rho in [0, 1] and its form, the bias kappa, the
    self-correlation c in [-1, 1] of one rollout's uses (each None if not measured), and the
    variant the probes support ("standard" or one of ``replaytheory.model.reuse.VARIANTS``), which
    made the prediction."""

    alpha: float
    power_law_ok: bool
    rho: float
    rho_form: str
    kappa: float | None
    reuse_c: float | None = None
    variant: str = "standard"


@dataclass(frozen=True)
class DemoSummary:
    """What ``summary.json`` holds. mu: the accounting cost ratio (> 0); mu_measured: the tiny
    model's own. target_accuracy: TARGET_SHARE of the way from warm_start_accuracy to the best
    final accuracy. advised_horizon / advised_replay_ratio: the calculator's x (updates) and
    y (``replaytheory.advice.advise`` at mu and the run's length, theory.md section 13) in
    its regime ("replay" or "on_policy"); run_horizon / run_replay_ratio: the runnable cell
    trained for it; advice_gain: its measured AUC minus on-policy's at equal compute over
    the ``advice_settings`` settings measured at ``advice_run_updates`` updates (an
    ``advice.Spread``), None without on-policy cells. model_horizon /
    model_replay_ratio / model_saving: x*, y* and the predicted compute saving of the
    calibrated model's own design (section 5 or 10), whose horizon is unvalidated."""

    mu: float
    mu_measured: float
    target_accuracy: float
    warm_start_accuracy: float
    advised_horizon: float
    advised_replay_ratio: float
    regime: str
    run_horizon: float
    run_replay_ratio: float
    advice_gain: Spread | None
    fit: DemoFit
    notes: list[str]
    runs: list[DemoRun]
    advice_settings: int = 0
    advice_run_updates: int = 0
    model_horizon: float = math.nan
    model_replay_ratio: float = math.nan
    model_saving: float = math.nan


def _runnable(x: float, y: float) -> tuple[float, float]:
    """A design as harness settings: x in [1, 64] steps (a table only covers the staleness it
    measured), y in [1, 8], rounded to 2 decimals."""
    return round(float(np.clip(x, 1.0, 64.0)), 2), round(float(np.clip(y, 1.0, 8.0)), 2)


def _cells(x: float, y: float) -> list[dict]:
    """The advised cell, on-policy, and half / twice the advised reuse."""
    cells = [{"schedule.mode": "on_policy"}]
    for yy in (y, y / 2, y * 2):
        xx, yy = _runnable(x, yy)
        cell = {"buffer.horizon": xx, "schedule.replay_ratio": yy}
        if cell not in cells:
            cells.append(cell)
    return cells


def _phase_bar(phase: str, total: int | None, enabled: bool, **kw) -> tqdm:
    number = PHASES.index(phase) + 1
    return tqdm(total=total, desc=f"demo {number}/{len(PHASES)}: {phase}", disable=not enabled,
                dynamic_ncols=True, **kw)


def _logged_steps(path: str) -> int:
    """Steps a run has finished: one more than the step of the last complete record of its
    ``metrics.jsonl`` (0 while it has none). Reads only the last 64 KiB of the file."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            lines = fh.read().split(b"\n")[:-1]  # what follows the last newline may be torn
        return int(json.loads(lines[-1])["step"]) + 1
    except (FileNotFoundError, IndexError):  # no log or no complete record yet
        return 0


def _metrics_logs(sweep_dir: str) -> list[str]:
    return glob.glob(os.path.join(sweep_dir, "runs", "*", "metrics.jsonl"))


@contextmanager
def _following(sweep_dir: str, phase: str, steps: int, runs: int, enabled: bool,
               warm_start: bool = False):
    """Show the progress of a sweep running into ``sweep_dir`` while the block runs: with
    ``warm_start``, first the time until a run starts logging (its process warm-starts the
    model before its first step), then the steps logged by the runs out of ``steps * runs``,
    polled once a second (the runs are separate processes)."""
    if not enabled:
        yield
        return
    stop = threading.Event()

    def poll():
        if warm_start:
            with _phase_bar("warm start", None, True, bar_format="{desc}: {elapsed}") as wait:
                while not _metrics_logs(sweep_dir) and not stop.wait(1.0):
                    wait.refresh()
        with _phase_bar(phase, steps * runs, True, unit="step") as bar:
            while True:
                stopped = stop.wait(1.0)
                bar.n = sum(min(steps, _logged_steps(p)) for p in _metrics_logs(sweep_dir))
                bar.refresh()
                if stopped:
                    return

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run_demo(out: str, mu: float = 6.84, steps: int = 150, workers: int = 2,
             progress: bool = True, overrides: dict | None = None) -> DemoSummary:
    """Run the demo into ``out`` and draw its figure; returns the summary (also written to
    summary.json, floats shown to ``SHOWN_DIGITS`` significant digits).

    mu: accounting cost ratio (finite, > 0). steps: steps per compared run (integer >= 2).
    workers: compared runs at a time (integer >= 1). ``overrides``: extra config settings for
    every run (e.g. a smaller model in tests).
    """
    checks.positive("mu", mu)
    checks.integer("steps", steps, 2)
    checks.integer("workers", workers, 1)  # before the calibration run's minutes
    base = {**BASE, **(overrides or {})}
    os.makedirs(out, exist_ok=True)
    cal_dir = os.path.join(out, "calibration")
    with _following(cal_dir, "calibration run", CALIBRATION_STEPS, 1, progress,
                    warm_start=True):
        spec = calibration_spec("cpu_tiny", base, CALIBRATION_STEPS, CALIBRATION_HORIZON,
                                seeds=1)
        counts = run_sweep(spec, cal_dir, workers=1, progress=False)
    if counts.failed:
        raise RuntimeError(f"the calibration run failed: see {cal_dir}/logs")
    with _phase_bar("prediction", 1, progress) as bar:
        probes = load_probes(_probe_files(cal_dir))
        cal = calibrate(probes, probes.counts)
        design = cal.design(mu)
        advice = advise(mu, steps)
        bar.update(1)
    x, y = (1.0, 1.0) if advice.on_policy else _runnable(advice.horizon, advice.replay_ratio)
    spec = {"config": "cpu_tiny", "set": {**base, "run.steps": steps}, "cells": _cells(x, y)}
    runs_dir = os.path.join(out, "runs")
    with _following(runs_dir, "training runs", steps, len(spec["cells"]), progress):
        counts = run_sweep(spec, runs_dir, workers=workers, progress=False)
    if counts.failed:
        raise RuntimeError(f"{counts.failed} demo run(s) failed: see {runs_dir}/logs")
    curves = os.path.join(out, "curves.jsonl")
    compact_sweep(runs_dir, curves)
    summary = _summarise(load_runs(curves), cal, design, advice, mu, (x, y))
    write_json(os.path.join(out, "summary.json"), _shown(asdict(summary)))
    _draw(out)
    return summary


def _probe_files(cal_dir: str) -> list[str]:
    runs = os.path.join(cal_dir, "runs")
    return [os.path.join(runs, d, "probes.npz") for d in os.listdir(runs)]


def _shown(obj):
    """``obj`` with every float rounded to SHOWN_DIGITS significant digits."""
    if isinstance(obj, float):
        return float(f"{obj:.{SHOWN_DIGITS}g}")
    if isinstance(obj, dict):
        return {k: _shown(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_shown(v) for v in obj]
    return obj


def _label(run) -> str:
    if kind(run) == "on_policy":
        return "on-policy"
    return f"x={run.get('buffer.horizon'):g}, y={run.get('schedule.replay_ratio'):g}"


def _summarise(runs, cal, design, advice, mu, xy) -> DemoSummary:
    """The summary of the compared runs (see ``DemoSummary``)."""
    warm = float(runs[0].eval["eval_accuracy"][0])
    best_final = max(float(r.eval["eval_accuracy"][-1]) for r in runs)
    target = warm + TARGET_SHARE * (best_final - warm)
    budget = min(float(r.compute(mu)[-1]) for r in runs)
    rows = []
    for r in runs:
        comp, acc = r.compute(mu), r.eval["eval_accuracy"]
        rows.append(DemoRun(
            config=_label(r), run_id=r.run_id,
            predicted=tuple(xy) == (r.get("buffer.horizon"), r.get("schedule.replay_ratio")),
            final_accuracy=float(acc[-1]), tail_accuracy=r.tail_accuracy(),
            compute=float(comp[-1]),
            compute_to_target=compute_to_target(comp, acc, target, interpolate=True),
            mean_accuracy=mean_over_budget(comp, acc, budget)))
    n = cal.noise
    fit = DemoFit(alpha=n.alpha, power_law_ok=n.power_law_ok, rho=cal.coupling.rho,
                  rho_form=cal.coupling.form, kappa=cal.bias.kappa if cal.bias else None,
                  reuse_c=cal.reuse.c if cal.reuse else None,
                  variant=cal.variant_choice.variant if cal.variant_choice else "standard")
    return DemoSummary(mu=mu, mu_measured=cal.mu, target_accuracy=target,
                       warm_start_accuracy=warm, advised_horizon=advice.horizon,
                       advised_replay_ratio=advice.replay_ratio,
                       regime="on_policy" if advice.on_policy else "replay",
                       run_horizon=xy[0], run_replay_ratio=xy[1], advice_gain=advice.gain,
                       fit=fit, notes=list(design.notes) + list(cal.notes), runs=rows,
                       advice_settings=len(advice.evidence),
                       advice_run_updates=advice.run_updates,
                       **(_model_design(design) if design.regime == "replay" else {}))


def _model_design(design) -> dict:
    """The calibrated model's own replay design as ``DemoSummary`` fields."""
    return {"model_horizon": design.horizon, "model_replay_ratio": design.replay_ratio,
            "model_saving": design.predicted_saving}


def prediction_lines(s: DemoSummary) -> list[str]:
    """The terminal report's first part: every number of the advice, named in words (what x,
    y and mu are, where the advice comes from, what was trained, the saving that comes with
    it, what the calibrated model alone would choose, the target accuracy)."""
    lines = ["What the calculator advised, and what the calibration measured:",
             f"  generation cost mu = {s.mu:g} trainer updates per generated batch (the "
             f"accounting value; this tiny model's own measured mu = {s.mu_measured:.3g})"]
    if s.regime == "replay":
        lines += [f"  advised staleness horizon x = {s.advised_horizon:.3g} updates (x = N/R: "
                  f"the oldest rollout in the buffer was generated x updates ago)",
                  f"  advised replay ratio y = {s.advised_replay_ratio:.3g} (y = B/R: how "
                  f"many times each rollout is used, on average)",
                  f"  trained as x = {s.run_horizon:g}, y = {s.run_replay_ratio:g}, against "
                  f"on-policy training (no buffer, x = y = 1) and half and twice that reuse"]
    else:
        lines.append("  advice: on-policy training (no buffer, x = y = 1) at this mu and run "
                     "length")
    where = (f"the {s.advice_settings} committed grids measured at {s.advice_run_updates} "
             f"updates and the mu nearest (theory.md section 13)")
    if s.advice_gain is not None:
        g = s.advice_gain
        lines.append(f"  measured with it on {where}: {g.mean:+.3f} mean accuracy against "
                     f"on-policy at equal compute (from {g.low:+.3f} to {g.high:+.3f})")
    else:
        lines.append(f"  from {where}")
    model = (f"x* = {s.model_horizon:.3g} updates, y* = {s.model_replay_ratio:.3g}, "
             f"predicted compute saving {s.model_saving:.0%}" if math.isfinite(s.model_horizon)
             else "on-policy training")
    lines.append(f"  the calibrated model ({s.fit.variant}, the variant the probes support, "
                 f"theory.md 10.7) alone would choose {model}: its horizon is unvalidated")
    share = (s.target_accuracy - s.warm_start_accuracy) / max(
        max(r.final_accuracy for r in s.runs) - s.warm_start_accuracy, 1e-12)
    lines.append(f"  target accuracy {s.target_accuracy:.3f}: {share:.0%} of the way from the "
                 f"warm start ({s.warm_start_accuracy:.3f}) to the best final accuracy of the "
                 f"runs ({max(r.final_accuracy for r in s.runs):.3f})")
    return lines


def verdict_lines(s: DemoSummary) -> list[str]:
    """The terminal report: the runs ranked by the target-free score (mean accuracy over the
    common compute budget), the predicted run marked with its rank, and what one seed per run
    can and cannot show."""
    ranked = sorted(s.runs, key=lambda r: -r.mean_accuracy if math.isfinite(r.mean_accuracy)
                    else math.inf)
    budget = min(r.compute for r in s.runs)
    lines = [f"Runs ranked by mean held-out accuracy over the ranking window, the first "
             f"{budget:.4g} updates of compute (what every run spent; a generated batch counts "
             f"as mu = {s.mu:g} updates); compute to target: updates to first reach "
             f"{s.target_accuracy:.3f}:"]
    for i, r in enumerate(ranked, 1):
        reach = f"{r.compute_to_target:.4g}" if math.isfinite(r.compute_to_target) \
            else f"not reached in {r.compute:.4g}"
        lines.append(f"  {i}. {r.config:>18s}{' (advised)' if r.predicted else '':12s} "
                     f"mean acc {r.mean_accuracy:.3f}  final {r.final_accuracy:.3f}  "
                     f"compute to target: {reach}")
    pred = [i for i, r in enumerate(ranked, 1) if r.predicted]
    where = f"ranked {pred[0]} of {len(ranked)} on that window" if pred \
        else "was not run (on-policy chosen)"
    lines.append(f"The advised configuration {where}. One seed per run: this shows the "
                 f"pipeline end to end, not whether the advice holds (seed noise alone can "
                 f"reorder these runs); the evidence is the seed-bootstrap sweeps in results/ "
                 f"(docs/findings.md, figures/out/advice.md).")
    return lines


def _draw(out: str) -> None:
    """``demo.png``/``demo.pdf`` in ``out`` from its saved summary and curves, drawn by
    ``figures.demo`` in its own process: the harness never imports ``figures``."""
    cmd = [sys.executable, "-m", "figures.demo", out]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no error output"])[-1]
        raise RuntimeError(f"drawing the figure failed ({last}); the results are saved, "
                           f"redraw with: {shlex.join(cmd)}")


def main(argv=None) -> int:
    """Command line (see the module docstring); exit status 0, or 2 on bad input or a failed
    run."""
    p = Parser.from_doc("llm_experiments demo", __doc__)
    p.add_argument("--out", type=output_dir, default="runs/demo",
                   help="output folder (rerun to resume)")
    p.add_argument("--mu", type=real(0.0, lo_open=True), default=6.84,
                   help="accounting mu, > 0 (default 6.84)")
    p.add_argument("--steps", type=integer(2), default=150,
                   help="steps per compared run, >= 2 (default 150)")
    p.add_argument("--workers", type=integer(1), default=2,
                   help="runs at a time, >= 1 (default 2)")
    a = p.parse_args(argv)
    try:
        s = run_demo(a.out, a.mu, a.steps, a.workers)
    except (ValueError, RuntimeError) as exc:
        return p.report(exc)
    print("\n".join(prediction_lines(s) + verdict_lines(s)))
    print(f"figure: {os.path.join(a.out, 'demo.png')}\nsummary: "
          f"{os.path.join(a.out, 'summary.json')}")
    return 0
