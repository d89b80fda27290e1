"""The verdict of ``experiments/seconds_long.yaml`` (SL1-SL4; issue 37 part 3): the saving in
seconds on cpu_long at two measured mu levels.

``python -m llm_experiments.study.verdicts.seconds_long --curves
results/seconds_long/curves.jsonl.gz --out results/seconds_long/verdict.json``

Per level (``sampler.max_concurrent``) and seed: the target a_s is on-policy's mean eval
accuracy over its last ``TARGET_EVALS`` evaluations; each cell's seconds to first reach it
(its own measured clock, ``seconds.seconds_at_evals``, interpolated between evaluations; inf
if never) over on-policy's is its ratio. Per cell: the mean ratio over seeds with its 95%
seed-bootstrap interval (a cell that never reaches the target on some seed has an infinite
mean; reported beside it: each seed's ratio, the seeds that reach it and the median), the mean
accuracy over seconds in [0, the level's budget] (the least median run seconds
over its cells, as ``judge``'s auc_seconds) and over accounted compute at the level's
measured mu (the median of its on-policy runs' ``mu_measured``) in [0, the least median
compute], the paired difference of the former from on-policy's (mean and 95% seed-bootstrap
interval), and the measured mu. The claims read only the seeds every cell of a level holds.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np

from replaytheory.io import write_text
from replaytheory.stats.analysis import compute_to_target, mean_over_budget
from replaytheory.stats.verdicts import seed_draws

from ..results import load_runs
from ..seconds import RunCosts, seconds_at_evals

LEVEL = "sampler.max_concurrent"
TARGET_EVALS = 2
DRAWS = 2000
HIGH, NATURAL = 16, 0  # the registered levels
ADVICE = (16.0, 2.0)  # the calculator's advice at T = 150, both levels
RULE = {NATURAL: (64.0, 1.4), HIGH: (64.0, 2.8)}  # x = 64, y = sqrt(mu) on the ladder
SEEDS = 5  # registered per level
HEADLINE = 0.6  # SL1: the paper's "<= 0.6x the seconds"
NEAR = 0.02  # SL4: AUC points


@dataclass(frozen=True)
class Cell:
    """A grid cell of one level: horizon x (updates; 1 with y = 1 for on-policy), replay
    ratio y, and whether the buffer evicts by drift (``buffer.drop_logr2`` > 0)."""

    x: float
    y: float
    adaptive: bool

    @classmethod
    def of(cls, settings: dict) -> "Cell":
        if settings.get("schedule.mode") == "on_policy":
            return cls(1.0, 1.0, False)
        return cls(float(settings["buffer.horizon"]), float(settings["schedule.replay_ratio"]),
                   float(settings.get("buffer.drop_logr2") or 0) > 0)

    @property
    def label(self) -> str:
        if self.x == 1 and self.y == 1:
            return "on-policy"
        return f"x={self.x:g}, y={self.y:g}" + (", adaptive" if self.adaptive else "")


ON_POLICY = Cell(1.0, 1.0, False)


def mean_interval(values: np.ndarray) -> tuple[float, float, float]:
    """Mean of per-seed ``values`` and its 95% seed-bootstrap interval."""
    boots = values[seed_draws(values.size, DRAWS, 0)].mean(1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return float(values.mean()), float(lo), float(hi)


def judge_level(runs: dict) -> dict:
    """One level's verdict from ``runs`` ({cell: {seed: run}}) on the seeds every cell holds."""
    seeds = sorted(set.intersection(*(set(by) for by in runs.values())))
    if ON_POLICY not in runs or not seeds:
        return {}
    on = runs[ON_POLICY]
    target = {s: float(np.mean(on[s].eval["eval_accuracy"][-TARGET_EVALS:])) for s in seeds}

    def to_target(run, s):
        acc = np.asarray(run.eval["eval_accuracy"], float)
        return compute_to_target(seconds_at_evals(run), acc, target[s], interpolate=True)
    mu = float(np.median([on[s].summary["mu_measured"] for s in seeds]))
    budget_s = min(np.median([RunCosts.of(r[s]).total(r[s]) for s in seeds]) for r in runs.values())
    compute = {c: {s: r[s].compute(mu) for s in seeds} for c, r in runs.items()}
    budget_c = min(np.median([compute[c][s][-1] for s in seeds]) for c in runs)
    on_seconds = {s: to_target(on[s], s) for s in seeds}

    accs = {c: {s: np.asarray(by[s].eval["eval_accuracy"], float) for s in seeds}
            for c, by in runs.items()}

    def auc_seconds(c):
        return np.array([mean_over_budget(seconds_at_evals(runs[c][s]), accs[c][s], budget_s)
                         for s in seeds])
    on_auc = auc_seconds(ON_POLICY)
    cells = {}
    for c, by in runs.items():
        with np.errstate(divide="ignore", invalid="ignore"):  # on-policy at its target at once
            ratio = np.array([to_target(by[s], s) / on_seconds[s] for s in seeds])
        acc = accs[c]
        auc = auc_seconds(c)
        cells[c.label] = {
            "x": c.x, "y": c.y, "adaptive": c.adaptive,
            "ratio": mean_interval(ratio) if np.isfinite(ratio).all() else
            (float(np.mean(ratio)),) * 3,
            "ratio_per_seed": [float(r) for r in ratio],
            "reached": int(np.isfinite(ratio).sum()),
            "median_ratio": float(np.median(ratio)),
            "auc_seconds": float(auc.mean()),
            "auc_seconds_minus_on_policy": mean_interval(auc - on_auc),
            "auc_compute": float(np.mean([mean_over_budget(compute[c][s], acc[s], budget_c)
                                          for s in seeds])),
            "mu_measured": float(np.median([by[s].summary["mu_measured"] for s in seeds]))}
    buffers = {k: v for k, v in cells.items() if k != ON_POLICY.label}
    # Ties of the registered mean (inf when no cell reaches the target on every seed) are
    # broken by the median ratio, then the seeds reached; the claims read the mean.
    best = min(buffers, key=lambda k: (buffers[k]["ratio"][0], buffers[k]["median_ratio"],
                                       -buffers[k]["reached"]))
    return {"seeds": seeds, "mu": mu, "budget_seconds": float(budget_s), "cells": cells,
            "best_buffer": best, "best_auc_seconds": max(cells, key=lambda k:
                                                         cells[k]["auc_seconds"])}


def claims(levels: dict) -> dict:
    """SL1-SL4 of the registration as far as both levels allow."""
    hi, lo = levels.get(HIGH), levels.get(NATURAL)
    out: dict = {}
    if hi:
        out["SL1"] = hi["cells"][hi["best_buffer"]]["ratio"][0] <= HEADLINE
    if hi and lo:
        out["SL2"] = hi["cells"][hi["best_buffer"]]["ratio"][0] < \
            lo["cells"][lo["best_buffer"]]["ratio"][0]
        out["SL3"] = hi["cells"][hi["best_auc_seconds"]]["y"] >= \
            lo["cells"][lo["best_auc_seconds"]]["y"]
    near = []
    for level, v in ((HIGH, hi), (NATURAL, lo)):
        if v:
            by_xy = {(c["x"], c["y"]): c for c in v["cells"].values() if not c["adaptive"]}
            a, r = by_xy.get(ADVICE), by_xy.get(RULE[level])
            if a and r:
                near.append(abs(a["auc_seconds"] - r["auc_seconds"]) <= NEAR)
    if len(near) == 2:
        out["SL4"] = all(near)
    return out


def runs_by_level(curves: str) -> dict:
    """The compacted runs ``curves`` as {level: {cell: {seed: run}}}, ``LEVEL`` the level."""
    by_level: dict = {}
    for r in load_runs(curves):
        by_level.setdefault(int(r.settings.get(LEVEL) or 0), {}).setdefault(
            Cell.of(r.settings), {})[int(r.settings["run.seed"])] = r
    return by_level


def judge(curves: str) -> dict:
    """The verdict of the compacted runs ``curves`` (module docstring)."""
    by_level = runs_by_level(curves)
    levels = {level: v for level, runs in sorted(by_level.items()) if (v := judge_level(runs))}
    complete = all(len(levels.get(k, {}).get("seeds", ())) >= SEEDS for k in (HIGH, NATURAL))
    return {"levels": {str(k): v for k, v in levels.items()}, "claims": claims(levels),
            "complete": complete}


def verdict_cli(judge_curves, doc: str, argv=None) -> int:
    """``--curves C --out V``: write ``judge_curves(C)`` to V as JSON, print its claims."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--curves", required=True, help="compacted runs of the grid")
    p.add_argument("--out", required=True, help="the verdict JSON to write")
    a = p.parse_args(argv)
    verdict = judge_curves(a.curves)
    write_text(a.out, json.dumps(verdict, indent=1, sort_keys=True) + "\n")
    print(json.dumps(verdict["claims"]))
    return 0


def main(argv=None) -> int:
    return verdict_cli(judge, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
