"""Reading learning curves: compute to a target, seeds, Pareto frontiers, rank agreement.

Shared by the simulation validation and the LLM sweeps, so that "best configuration",
"compute to target" and "regret" mean the same thing everywhere. numpy + scipy only.

Conventions: a learning curve is a pair of 1-d arrays (compute, metric) with compute
non-decreasing (e.g. trainer-update units, theory.md section 3) and a metric to maximise
(accuracy, reward; pass ``-loss`` for losses). Missing values are NaN. "Never reached" is inf.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
from scipy import stats

from .. import checks

_BIG = 1e300


def _curve(compute, metric):
    c = np.asarray(compute, dtype=float)
    m = np.asarray(metric, dtype=float)
    if c.ndim != 1 or c.shape != m.shape:
        raise ValueError(f"compute and metric must be 1-d arrays of the same length, got "
                         f"{c.shape} and {m.shape}")
    keep = ~np.isnan(m) & ~np.isnan(c)
    c, m = c[keep], m[keep]
    if np.any(np.diff(c) < 0):
        raise ValueError("compute must be non-decreasing along a curve")
    return c, m


def compute_to_target(compute, metric, target: float, interpolate: bool = False) -> float:
    """Compute at which ``metric`` first reaches ``target`` (inf if never; NaNs skipped).

    With ``interpolate``, linear interpolation between the last point below and the first
    at or above the target (logged points are sparse); otherwise the first logged point.
    """
    c, m = _curve(compute, metric)
    target = checks.real("target", target)
    hit = np.flatnonzero(m >= target)
    if hit.size == 0:
        return math.inf
    i = int(hit[0])
    if not interpolate or i == 0:
        return float(c[i])
    frac = (target - m[i - 1]) / (m[i] - m[i - 1])
    return float(c[i - 1] + frac * (c[i] - c[i - 1]))


def mean_over_budget(compute, metric, budget: float) -> float:
    """Mean of ``metric`` over compute in [0, ``budget``]: (1/budget) * integral of the curve.

    The curve is interpolated linearly between logged points; before the first point it takes
    the first value, and a curve that ends before ``budget`` holds its last value. For an
    accuracy curve this is the average over budgets up to ``budget`` of the accuracy reached,
    which equals the average over targets of the compute left after reaching them: a
    target-free score (higher is better; the primary measure of the resolving sweep,
    theory.md section 8). ``budget`` > 0, in the compute's units.
    """
    c, m = _curve(compute, metric)
    budget = checks.positive("budget", budget)
    if m.size == 0:
        return math.nan
    grid = np.concatenate([[0.0], c[(c > 0) & (c < budget)], [budget]])
    values = np.interp(grid, c, m)
    return float(np.trapezoid(values, grid) / budget)


def compute_to_fraction_of_best(compute, metric, fraction: float = 0.98) -> float:
    """Compute to first reach ``fraction`` (in (0, 1]) of the curve's own best value."""
    c, m = _curve(compute, metric)
    fraction = checks.real("fraction", fraction, 0.0, 1.0, lo_open=True)
    if m.size == 0:
        return math.inf
    return compute_to_target(c, m, fraction * float(np.max(m)))


def tail_mean(compute, metric, fraction: float = 0.25) -> float:
    """Mean of the metric over the last ``fraction`` of the compute budget (a smoothed score).

    The window is [c_end - fraction * c_end, c_end]; NaN if no point falls inside.
    """
    c, m = _curve(compute, metric)
    fraction = checks.real("fraction", fraction, 0.0, 1.0, lo_open=True)
    if c.size == 0:
        return math.nan
    inside = c >= c[-1] * (1 - fraction)
    return float(np.mean(m[inside])) if np.any(inside) else math.nan


def median_iqr(values, axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(median, 25th, 75th percentile) along ``axis``, ignoring NaN.

    inf ("never reached") is a value like any other: a median of mostly-inf entries is inf.
    """
    a = np.asarray(values, dtype=float)
    # A large finite stand-in keeps the interpolation of inf with inf from giving NaN.
    big = np.where(np.isposinf(a), _BIG, a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN
        q = np.nanpercentile(big, [50, 25, 75], axis=axis)
    q = np.where(q >= _BIG / 2, np.inf, q)
    return q[0], q[1], q[2]


def curves_on_grid(curves, grid) -> np.ndarray:
    """Resample curves [(compute, metric), ...] on a shared compute grid (step-wise hold).

    Each curve's value at grid point g is its last logged value at compute <= g (NaN before
    its first point), so medians and IQR bands over seeds are taken at equal compute.
    """
    grid = np.asarray(grid, dtype=float)
    out = np.full((len(curves), grid.size), np.nan)
    for k, (c, m) in enumerate(curves):
        c, m = _curve(c, m)
        idx = np.searchsorted(c, grid, side="right") - 1
        ok = idx >= 0
        out[k, ok] = m[idx[ok]]
    return out


def pareto_frontier(compute, metric) -> np.ndarray:
    """Indices of the points no other point beats (less or equal compute, higher metric).

    Sorted by compute. A point with NaN is never on the frontier.
    """
    c = np.asarray(compute, dtype=float)
    m = np.asarray(metric, dtype=float)
    if c.shape != m.shape or c.ndim != 1:
        raise ValueError("compute and metric must be 1-d arrays of the same length")
    order = [i for i in np.lexsort((-m, c)) if not (np.isnan(c[i]) or np.isnan(m[i]))]
    frontier, best = [], -math.inf
    for i in order:
        if m[i] > best:
            frontier.append(int(i))
            best = m[i]
    return np.asarray(frontier, dtype=np.int64)


def spearman(a, b) -> float:
    """Spearman rank correlation over the entries finite in both (NaN if < 3 such entries).

    inf values are ranked as the largest (e.g. "never reached the target").
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    keep = ~np.isnan(a) & ~np.isnan(b)
    if keep.sum() < 3:
        return math.nan
    a, b = a[keep], b[keep]
    if np.ptp(stats.rankdata(a)) == 0 or np.ptp(stats.rankdata(b)) == 0:
        return math.nan
    return float(stats.spearmanr(a, b).statistic)


def best_option(scores, better: str = "max") -> tuple[np.ndarray, np.ndarray]:
    """Per cell, the best option (e.g. learning rate) by its median over seeds.

    Args:
        scores: array (cells, options, seeds); NaN = missing run.
        better: "max" (accuracy) or "min" (compute to target).
    Returns:
        (median of the best option per cell, index of that option per cell; -1 if none).
    """
    s = np.asarray(scores, dtype=float)
    if s.ndim != 3:
        raise ValueError(f"scores must be (cells, options, seeds), got shape {s.shape}")
    better = checks.choice("better", better, ("max", "min"))
    med = median_iqr(s, axis=2)[0]
    key = np.where(np.isnan(med), -np.inf if better == "max" else np.inf, med)
    idx = np.argmax(key, axis=1) if better == "max" else np.argmin(key, axis=1)
    best = med[np.arange(len(med)), idx]
    return best, np.where(np.isnan(best), -1, idx)


def split_half_spearman(scores, better: str = "max", max_splits: int = 64,
                        seed: int = 0) -> float:
    """Agreement of a grid with itself: split the seeds in two halves, score each cell in each
    half (best option by that half's median), and average the Spearman correlation of the two
    halves' cell scores over splits.

    Choosing the option (learning rate) inside each half keeps the selection from inflating
    the agreement.

    Args:
        scores: (cells, seeds) or (cells, options, seeds), NaN for missing runs, >= 2 seeds.
        better: "max" or "min", which option is best. max_splits: at most this many
            balanced splits (all of them if fewer exist).
    Returns:
        Mean Spearman over splits (the issue's gate: >= 0.9 before judging a theory).
    """
    s = np.asarray(scores, dtype=float)
    if s.ndim == 2:
        s = s[:, None, :]
    if s.ndim != 3 or s.shape[2] < 2:
        raise ValueError(f"scores must be (cells, seeds) or (cells, options, seeds) with at "
                         f"least 2 seeds, got {np.shape(scores)}")
    n = s.shape[2]
    splits = list(itertools.combinations(range(n), n // 2))
    if n % 2 == 0:  # {A, B} and {B, A} are the same split
        splits = splits[: len(splits) // 2]
    if len(splits) > max_splits:
        rng = np.random.default_rng(seed)
        splits = [splits[i] for i in rng.choice(len(splits), max_splits, replace=False)]
    values = []
    for first in splits:
        second = [j for j in range(n) if j not in first]
        a = best_option(s[:, :, list(first)], better)[0]
        b = best_option(s[:, :, second], better)[0]
        r = spearman(a, b)
        if not math.isnan(r):
            values.append(r)
    return float(np.mean(values)) if values else math.nan


def regret(compute_predicted: float, compute_best: float) -> float:
    """Extra compute of the predicted configuration to reach the best one's target.

    ``compute_predicted / compute_best - 1``: 0 when the prediction is the best, inf when
    the predicted configuration never reaches the target.
    """
    cb = checks.positive("compute_best", compute_best)
    cp = float(compute_predicted)
    if math.isnan(cp) or cp < 0:
        raise ValueError(f"compute_predicted must be >= 0 or inf, got {compute_predicted!r}")
    return math.inf if math.isinf(cp) else cp / cb - 1.0
