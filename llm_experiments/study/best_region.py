"""Where the best of a judged grid lies and what a user loses away from it (issue 25 item 4;
theory.md section 8.3): the records ``judge`` writes beside each verdict.

* ``best_horizon``: the horizon of the best grid cell, the best score per horizon, and
  leave-one-seed-out paired differences to the adjacent horizons of the grid: for each seed,
  each horizon's (y, learning rate) is chosen on the other seeds and scored on that one
  (``replaytheory.stats.verdicts.leave_one_seed_out``), so the comparison is out of sample; the
  differences over seeds get a Student-t interval (``replaytheory.stats.verdicts.paired_difference``).
* ``within_noise``: the cells whose paired loss against the best cell (the bootstrap mode),
  in the same draws and in the regret's units, has an interval reaching 0 or below: the data
  cannot tell them from the best at the registration's level ("how much do I lose").
* ``compute_to_target``: beside the target-free AUC, the compute each piece of advice needs to
  first reach two accuracies, as a multiple of the fastest cell's in the same bootstrap draws.
  The targets are the registration's ``compute_targets`` or, by default, the warm start plus
  50% and 90% of the gain at the peak of the AUC-best cell's median eval curve (median over
  seeds at its best learning rate), rounded to 0.001: one middling, one high.

``grid`` is a ``judge.SweepGrid``.
"""

from __future__ import annotations

import numpy as np

from replaytheory.stats.analysis import best_option
from replaytheory.stats.verdicts import (bootstrap_verdict, leave_one_seed_out, paired_difference,
                                         regret_ratio)

# Default compute-to-target accuracies: the warm start plus these shares of the best cell's gain
TARGET_SHARES = (0.5, 0.9)


def grid_cells(grid) -> list[int]:
    """The indices of the grid's cells (on-policy left out)."""
    return [i for i in range(len(grid.cells)) if i != grid.on_policy]


def best_grid_cell(grid, p_best: np.ndarray, point: np.ndarray, better: str) -> int:
    """The grid cell most often best in the bootstrap (the mode cell unless on-policy is),
    ties broken by the better point score."""
    sign = 1.0 if better == "max" else -1.0
    return max(grid_cells(grid), key=lambda i: (
        p_best[i], -np.inf if np.isnan(point[i]) else sign * point[i]))


def best_horizon(grid, table: np.ndarray, better: str, verdict, level: float) -> dict:
    """The best horizon of one verdict (see the module docstring): its horizon and cell, the
    bootstrap probability that a cell of that horizon is best, per horizon the best cell and
    score (in sample) and the mean out-of-sample score, and the paired differences to the
    adjacent grid horizons (positive: the best horizon is better)."""
    keep = grid_cells(grid)
    horizons = sorted({float(grid.horizons[i]) for i in keep})
    groups = [[i for i in keep if grid.horizons[i] == h] for h in horizons]
    point, _ = best_option(table, better)
    top = best_grid_cell(grid, verdict.p_best, point, better)
    b = horizons.index(float(grid.horizons[top]))
    oos = leave_one_seed_out(table, better, groups)
    pick = np.nanargmax if better == "max" else np.nanargmin
    per = []
    for h, cells, scores in zip(horizons, groups, oos):
        ran = [i for i in cells if not np.isnan(point[i])]
        i = ran[int(pick(point[ran]))] if ran else None
        per.append({"horizon": h, "cell": grid.labels[i] if ran else None,
                    "score": float(point[i]) if ran else None,
                    "out_of_sample": float(np.nanmean(scores)) if np.isfinite(scores).any()
                    else None,
                    "p_best": float(sum(verdict.p_best[j] for j in cells))})
    return {"horizon": horizons[b], "cell": grid.labels[top], "p_best": per[b]["p_best"],
            "per_horizon": per,
            "neighbours": [{"horizon": horizons[k], "difference": paired_difference(
                oos[b], oos[k], better, level).as_dict()}
                for k in (b - 1, b + 1) if 0 <= k < len(horizons)]}


def within_noise(grid, verdict) -> list[dict]:
    """The cells within the noise of the best (see the module docstring), the best first, each
    with its paired loss against the best cell (median and interval, the regret's units)."""
    near = [i for i, v in enumerate(verdict.versus_mode) if v.low <= 0]
    near.sort(key=lambda i: (i != verdict.mode, verdict.versus_mode[i].median))
    return [{"cell": grid.labels[i], "loss": verdict.versus_mode[i].as_dict()} for i in near]


def default_targets(grid, cell: int, lr: float, warm_start: float) -> tuple:
    """The two default accuracies (see the module docstring) from cell ``cell`` at ``lr``;
    none when that cell's median curve never rises above the warm start (no gain to share)."""
    runs = [r for r in grid.runs[grid.cells[cell]] if r.lr == lr]
    n = min(len(r.eval["eval_accuracy"]) for r in runs)
    peak = float(np.max(np.median([r.eval["eval_accuracy"][:n] for r in runs], axis=0)))
    if peak <= warm_start:
        return ()
    return tuple(round(warm_start + f * (peak - warm_start), 3) for f in TARGET_SHARES)


def compute_to_target(grid, record: dict, tables: list, *, draws: int, seed: int,
                      level: float) -> list[dict]:
    """Per target accuracy (``tables``: (target, (cells, lrs, seeds) compute to reach it, inf
    if never) pairs), in the same bootstrap draws as the verdict ``record``: the fastest cell (mode)
    with its probability and its compute (median at its best lr), and the compute of the
    record's best cell, every prediction's judged cell and every baseline's, as a multiple of
    each draw's fastest cell (interval; inf = never reached)."""
    labels = [record["best_cell"], *(d["cell"] for d in record["predictions"].values()),
              *(d["cell"] for d in record["baselines"].values() if d)]
    which = {label: grid.labels.index(label) for label in dict.fromkeys(labels)}
    out = []
    for target, table in tables:
        v = bootstrap_verdict(table, "min", np.ones(len(grid.cells), bool), which,
                              lambda p, b: regret_ratio(p, b) + 1.0, draws=draws, seed=seed,
                              level=level)
        point, _ = best_option(table, "min")
        out.append({"target": target, "fastest_cell": grid.labels[v.mode],
                    "fastest_probability": float(v.p_best[v.mode]),
                    "fastest_compute": float(point[v.mode]),
                    "compute_ratio": {label: v.regret[label].as_dict() for label in which}})
    return out
