"""The main job: a small end-to-end paired experiment on the CPU (about 2 minutes on 2 cores,
one of them the first-time warm start).

``python -m llm_experiments demo --out runs/demo [--mu 6.84]``

1. A calibration run (``cpu_tiny`` with a buffer of 8 steps, gradient-noise probes) measures
   sigma(s), rho and kappa (``replaytheory.calibrate``).
2. The theory predicts the staleness horizon x* and replay ratio y* for the given mu (default
   6.84, the paper's Qwen3-0.6B cost ratio; the tiny model's own measured mu is reported too).
3. The predicted configuration, on-policy training and two neighbours (half and twice the
   predicted reuse) are trained, two at a time, as a resumable sweep.
4. ``demo.png``/``demo.pdf`` plot accuracy against compute with the prediction marked, and
   ``summary.json`` holds the prediction, the fitted constants and each run's results.

Every step is resumable: rerun the same command after an interruption.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from replaytheory import calibrate
from replaytheory.analysis import compute_to_target
from replaytheory.io import write_json

from .results import compact_sweep, load_runs
from .sweep import run_sweep
from .validation import load_probes

BASE = {"run.progress": False, "probe.every": 0}
CALIBRATION = {"run.steps": 60, "buffer.horizon": 8, "schedule.replay_ratio": 2.0,
               "probe.every": 10, "probe.fresh_groups": 32, "probe.buffer_groups": 8,
               "probe.crn_staleness": [1, 4]}


def _runnable(x: float, y: float) -> tuple[float, float]:
    """A design as harness settings: x in [1, 64] steps (a table only covers the staleness it
    measured), y in [1, 8], rounded to 2 decimals."""
    return round(float(np.clip(x, 1.0, 64.0)), 2), round(float(np.clip(y, 1.0, 8.0)), 2)


def _cells(x: float, y: float) -> list[dict]:
    """The predicted cell, on-policy, and half / twice the predicted reuse."""
    cells = [{"schedule.mode": "on_policy"}]
    for yy in (y, y / 2, y * 2):
        xx, yy = _runnable(x, yy)
        cell = {"buffer.horizon": xx, "schedule.replay_ratio": yy}
        if cell not in cells:
            cells.append(cell)
    return cells


def run_demo(out: str, mu: float = 6.84, steps: int = 150, workers: int = 2,
             progress: bool = True, overrides: dict | None = None) -> dict:
    """Run the demo into ``out``; returns the summary (also written to summary.json).

    ``overrides``: extra config settings for every run (e.g. a smaller model in tests).
    """
    if not (isinstance(mu, (int, float)) and mu > 0 and math.isfinite(mu)):
        raise ValueError(f"mu must be finite and > 0, got {mu!r}")
    if not (isinstance(steps, int) and steps >= 2):
        raise ValueError(f"steps must be an integer >= 2, got {steps!r}")
    base = {**BASE, **(overrides or {})}
    os.makedirs(out, exist_ok=True)
    cal_dir = os.path.join(out, "calibration")
    counts = run_sweep({"config": "cpu_tiny", "set": {**base, **CALIBRATION}},
                       cal_dir, workers=1, progress=progress)
    if counts["failed"]:
        raise RuntimeError(f"the calibration run failed: see {cal_dir}/logs")
    probes = load_probes([os.path.join(cal_dir, "runs", d, "probes.npz")
                          for d in os.listdir(os.path.join(cal_dir, "runs"))])
    cal = calibrate(probes, probes.counts)
    design = cal.design(mu)
    x, y = _runnable(design.horizon, design.replay_ratio) \
        if design.regime == "replay" else (1.0, 1.0)
    spec = {"config": "cpu_tiny", "set": {**base, "run.steps": steps},
            "cells": _cells(x, y)}
    runs_dir = os.path.join(out, "runs")
    counts = run_sweep(spec, runs_dir, workers=workers, progress=progress)
    if counts["failed"]:
        raise RuntimeError(f"{counts['failed']} demo run(s) failed: see {runs_dir}/logs")
    curves = os.path.join(out, "curves.jsonl")
    compact_sweep(runs_dir, curves)
    runs = load_runs(curves)
    summary = _summarise(runs, cal, design, mu, (x, y))
    write_json(os.path.join(out, "summary.json"), summary)
    _plot(runs, summary, mu, out)
    return summary


def _label(run) -> str:
    if run.get("schedule.mode") == "on_policy":
        return "on-policy"
    return f"x={run.get('buffer.horizon'):g}, y={run.get('schedule.replay_ratio'):g}"


def _summarise(runs, cal, design, mu, xy) -> dict:
    warm = float(runs[0].eval["eval_accuracy"][0])
    best_final = max(float(r.eval["eval_accuracy"][-1]) for r in runs)
    target = warm + 0.8 * (best_final - warm)  # 80% of the way from the start to the best
    rows = []
    for r in runs:
        comp = r.compute(mu)
        rows.append({"config": _label(r), "predicted": tuple(xy) == (
            r.get("buffer.horizon"), r.get("schedule.replay_ratio")),
            "final_accuracy": float(r.eval["eval_accuracy"][-1]),
            "tail_accuracy": r.tail_accuracy(), "compute": float(comp[-1]),
            "compute_to_target": compute_to_target(comp, r.eval["eval_accuracy"], target,
                                                   interpolate=True)})
    n = cal.noise
    return {"mu": mu, "mu_measured": cal.mu, "target_accuracy": target,
            "warm_start_accuracy": warm, "predicted_horizon": design.horizon,
            "predicted_replay_ratio": design.replay_ratio, "regime": design.regime,
            "run_horizon": xy[0], "run_replay_ratio": xy[1],
            "predicted_saving": design.predicted_saving,
            "fit": {"alpha": n.alpha, "power_law_ok": n.power_law_ok, "rho": cal.coupling.rho,
                    "rho_form": cal.coupling.form,
                    "kappa": cal.bias.kappa if cal.bias else None},
            "notes": list(design.notes) + list(cal.notes), "runs": rows}


def _plot(runs, summary, mu, out) -> None:
    from figures.style import ON_POLICY_COLOR, PALETTE, plt, save
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for i, r in enumerate(runs):
        label = _label(r)
        predicted = label == f"x={summary['run_horizon']:g}, y={summary['run_replay_ratio']:g}"
        color = ON_POLICY_COLOR if label == "on-policy" else PALETTE[1 + i % 6]
        ax.plot(r.compute(mu), r.eval["eval_accuracy"], color=color,
                lw=2.2 if predicted else 1.2,
                label=label + (" (predicted)" if predicted else ""))
    ax.axhline(summary["target_accuracy"], color="grey", ls=":", lw=0.8)
    ax.set(xlabel=f"compute (trainer updates, mu={mu:g})", ylabel="held-out accuracy",
           title=f"predicted x*={summary['predicted_horizon']:.3g}, "
                 f"y*={summary['predicted_replay_ratio']:.3g}")
    ax.legend(fontsize=7)
    save(fig, "demo", out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="llm_experiments demo", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/demo", help="output folder (rerun to resume)")
    p.add_argument("--mu", type=float, default=6.84, help="accounting mu (default 6.84)")
    p.add_argument("--steps", type=int, default=150, help="steps per compared run")
    p.add_argument("--workers", type=int, default=2, help="runs at a time")
    a = p.parse_args(argv)
    try:
        s = run_demo(a.out, a.mu, a.steps, a.workers)
    except (ValueError, RuntimeError) as exc:
        print(f"llm_experiments demo: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: s[k] for k in ("mu", "mu_measured", "predicted_horizon",
                                        "predicted_replay_ratio", "regime")}, indent=1))
    for row in s["runs"]:
        print(f"  {row['config']:>18s}  final acc {row['final_accuracy']:.3f}  compute to "
              f"{s['target_accuracy']:.2f}: {row['compute_to_target']:.4g}")
    print(f"figure: {os.path.join(a.out, 'demo.png')}\nsummary: "
          f"{os.path.join(a.out, 'summary.json')}")
    return 0
