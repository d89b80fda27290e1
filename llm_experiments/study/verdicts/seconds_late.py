"""The verdict of ``experiments/seconds_late.yaml`` (LT1-LT3): does on-policy lead only early?
cpu_long at 300 updates, 4 sequences decoded at once, judged in seconds (theory.md 3.8).

``python -m llm_experiments.study.verdicts.seconds_late --curves
results/seconds_late/curves.jsonl.gz --out results/seconds_late/verdict.json``

The grid's one level is judged as seconds_long's (``seconds_long.judge_level``: each cell's
ratio of seconds to on-policy's final accuracy, AUC over seconds in [0, B] and over accounted
compute, B the least median run seconds). Added per buffer cell: its AUC over seconds in
[0, B/2] (early) and [B/2, B] (late) minus on-policy's, paired by seed, and the late-minus-early
gap (late difference - early difference), each with its mean and 95% seed-bootstrap interval.
Reported beside, not registered (``ends``): each buffer cell's run seconds over on-policy's, its
final accuracy (the mean of its last ``TARGET_EVALS`` evaluations) minus on-policy's, and minus
on-policy's accuracy at the cell's last second (on-policy's curve interpolated there).
"""

from __future__ import annotations

import numpy as np

from replaytheory.stats.analysis import mean_over_budget

from ..seconds import RunCosts, seconds_at_evals
from .seconds_long import (LEVEL, ON_POLICY, TARGET_EVALS, judge_level, mean_interval,
                           runs_by_level, verdict_cli)

ADVICE = (64.0, 2.0)  # the calculator's advice at T = 300, mu 2.95; also the rule's cell
HEADLINE = 0.6  # LT3
SEEDS = 5  # registered


def half_aucs(run, budget_s: float) -> tuple[float, float]:
    """Mean eval accuracy of ``run`` over its seconds in [0, budget_s / 2] and in
    [budget_s / 2, budget_s] (``budget_s`` > 0 s; the curve holds its last value past its end)."""
    secs, acc = seconds_at_evals(run), np.asarray(run.eval["eval_accuracy"], float)
    first, whole = (mean_over_budget(secs, acc, b) for b in (budget_s / 2, budget_s))
    return first, 2 * whole - first


def halves(runs: dict, seeds: list, budget_s: float) -> dict:
    """Per buffer cell of ``runs`` ({cell: {seed: run}}): its early and late AUC over seconds
    minus on-policy's, and the late-minus-early gap, over ``seeds``."""
    def of(cell):
        return np.array([half_aucs(runs[cell][s], budget_s) for s in seeds])
    on = of(ON_POLICY)
    out = {}
    for cell in runs:
        if cell == ON_POLICY:
            continue
        diff = of(cell) - on
        out[cell.label] = {"early_minus_on_policy": mean_interval(diff[:, 0]),
                           "late_minus_on_policy": mean_interval(diff[:, 1]),
                           "late_minus_early": mean_interval(diff[:, 1] - diff[:, 0])}
    return out


def ends(runs: dict, seeds: list) -> dict:
    """Per buffer cell of ``runs`` ({cell: {seed: run}}), paired by seed over ``seeds``: its
    run seconds over on-policy's, and its final accuracy minus on-policy's final accuracy and
    minus on-policy's accuracy at the same seconds (the cell's last)."""
    def final(run):
        return float(np.mean(run.eval["eval_accuracy"][-TARGET_EVALS:]))

    def seconds(run):
        return RunCosts.of(run).total(run)
    on = runs[ON_POLICY]
    out = {}
    for cell, by in runs.items():
        if cell == ON_POLICY:
            continue
        fin = np.array([final(by[s]) for s in seeds])
        on_then = np.array([np.interp(seconds(by[s]), seconds_at_evals(on[s]),
                                      on[s].eval["eval_accuracy"]) for s in seeds])
        out[cell.label] = {
            "seconds_over_on_policy": mean_interval(
                np.array([seconds(by[s]) / seconds(on[s]) for s in seeds])),
            "final_minus_on_policy_final": mean_interval(
                fin - np.array([final(on[s]) for s in seeds])),
            "final_minus_on_policy_same_seconds": mean_interval(fin - on_then)}
    return out


def claims(level: dict) -> dict:
    """LT1-LT3 of the registration from one level's verdict."""
    cells = level["cells"]
    advice = next((k for k, c in cells.items()
                   if (c["x"], c["y"]) == ADVICE and not c["adaptive"]), None)
    out: dict = {}
    if advice:
        out["LT1"] = level["halves"][advice]["late_minus_early"][0] > 0
        out["LT2"] = cells[advice]["reached"] == len(level["seeds"]) and \
            cells[advice]["ratio"][0] < 1
    out["LT3"] = cells[level["best_buffer"]]["ratio"][0] <= HEADLINE
    return out


def judge(curves: str) -> dict:
    """The verdict of the compacted runs ``curves`` (module docstring)."""
    by_level = runs_by_level(curves)
    if len(by_level) != 1:
        raise ValueError(f"curves: seconds_late has one level of {LEVEL}, got "
                         f"{sorted(by_level)}")
    (name, runs), = by_level.items()
    level = judge_level(runs)
    if not level:
        return {"levels": {}, "claims": {}, "complete": False}
    level["halves"] = halves(runs, level["seeds"], level["budget_seconds"])
    level["ends"] = ends(runs, level["seeds"])
    return {"levels": {str(name): level}, "claims": claims(level),
            "complete": len(level["seeds"]) >= SEEDS}


def main(argv=None) -> int:
    return verdict_cli(judge, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
