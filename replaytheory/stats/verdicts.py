"""Seed-bootstrap verdicts on a sweep: which cell is best, how sure, and how a prediction fares.

A sweep's scores form a table (cells, learning rates, seeds) with NaN for missing runs (as
``replaytheory.stats.analysis.best_option`` takes it). Every verdict here is a distribution over
bootstrap draws that resample the seed indices jointly (the same indices for every cell) and
re-choose each cell's learning rate inside every draw, so the selection of the learning rate is
part of the uncertainty (theory.md section 8). Out of sample, ``leave_one_seed_out`` scores
groups of cells (e.g. the horizons) on each seed with the option chosen on the others, and
``paired_difference`` compares two groups seed by seed (theory.md section 8.3). numpy and scipy.

``better``: "max" for scores to maximise (accuracy, area under the accuracy-compute curve),
"min" for compute to a target (inf = never reached).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

from .. import checks
from .analysis import spearman

BETTER = ("max", "min")
# Two cells are equally near a prediction when their squared distances in (log x, log y)
# agree to this relative tolerance: floating-point noise in x* (8.000000000000016 for 8, at
# horizons 4 and 16) must not decide a verdict, which then takes the worse cell.
TIE_RTOL = 1e-9


@dataclass(frozen=True)
class Interval:
    """A bootstrap distribution summarised: median and the central ``level`` interval."""

    median: float
    low: float
    high: float
    level: float

    def as_dict(self) -> dict:
        return {"median": self.median, "low": self.low, "high": self.high, "level": self.level}


@dataclass(frozen=True)
class Verdict:
    """The bootstrap verdict of one score table.

    p_best: per cell, the fraction of draws in which it is the best of the candidate cells
    (0 for cells that are not candidates). mode: index of the most frequent best cell.
    regret: per named prediction, the interval of its regret against each draw's best.
    spearman: per named objective, the interval of its rank agreement with the measured
    scores (positive = agreement). draws: the number of draws. versus_mode: per cell, the
    interval of its regret against the mode cell in the same draw (paired: negative in draws
    where it beats the mode); NaN intervals for cells without runs.
    """

    p_best: np.ndarray
    mode: int
    regret: dict[str, Interval]
    spearman: dict[str, Interval]
    draws: int
    versus_mode: tuple = ()


def interval(samples, level: float = 0.9) -> Interval:
    """Median and central ``level`` interval (in (0, 1)) of samples; inf values are kept
    (a regret of inf = the cell never reached the target in that draw), NaN dropped."""
    level = checks.real("level", level, 0.0, 1.0, lo_open=True, hi_open=True)
    x = np.asarray(samples, dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, level)
    lo, med, hi = np.quantile(x, [(1 - level) / 2, 0.5, (1 + level) / 2], method="nearest")
    return Interval(float(med), float(lo), float(hi), level)


def seed_draws(n_seeds: int, draws: int, seed: int) -> np.ndarray:
    """(draws, n_seeds) seed indices drawn with replacement; the first draw is the identity
    (the observed data), so verdicts always include the point estimate's own draw."""
    n_seeds = checks.integer("n_seeds", n_seeds, 1)
    draws = checks.integer("draws", draws, 1)
    idx = np.random.default_rng(seed).integers(0, n_seeds, size=(draws, n_seeds))
    idx[0] = np.arange(n_seeds)
    return idx


def scores_per_draw(table, idx: np.ndarray, better: str) -> np.ndarray:
    """(cells, draws) cell scores: per draw, each cell's median over the drawn seeds at the
    learning rate whose median is best in that draw. NaN where a cell has no run."""
    better = checks.choice("better", better, BETTER)
    t = np.asarray(table, dtype=float)
    if t.ndim != 3:
        raise ValueError(f"table must be (cells, learning rates, seeds), got {t.shape}")
    with warnings.catch_warnings():  # a cell or learning rate without runs: NaN, said here
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(t[:, :, idx], axis=3)  # (cells, lrs, draws)
    key = np.where(np.isnan(med), -np.inf if better == "max" else np.inf, med)
    best = key.max(axis=1) if better == "max" else key.min(axis=1)
    best[np.all(np.isnan(med), axis=1)] = np.nan
    return best


def regret_ratio(predicted, best) -> np.ndarray:
    """Compute regret predicted / best - 1 (``replaytheory.stats.analysis.regret``), vectorised."""
    p, b = np.asarray(predicted, float), np.asarray(best, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isinf(p), np.inf, p / b - 1.0)


def regret_gain(baseline: float):
    """Regret of a score to maximise as the share of the best cell's gain over ``baseline``
    (e.g. the warm-start accuracy) that a cell loses: (best - cell) / (best - baseline)."""
    def fn(predicted, best):
        p, b = np.asarray(predicted, float), np.asarray(best, float)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (b - p) / (b - baseline)
    return fn


def bootstrap_verdict(table, better: str, candidates, predictions: dict[str, int],
                      regret, objectives=None, draws: int = 2000, seed: int = 0,
                      level: float = 0.9) -> Verdict:
    """The seed-bootstrap verdict of a score table.

    Args:
        table: (cells, learning rates, seeds) scores, NaN = missing run.
        better: "max" or "min". candidates: boolean mask (cells,) of the cells that compete
            for "best" (e.g. the grid cells and on-policy).
        predictions: name -> index of the predicted cell (e.g. the nearest grid cell of a
            model variant's (x*, y*)). regret: f(predicted scores, best scores) -> regret,
            vectorised (``regret_ratio`` or ``regret_gain``).
        objectives: optional name -> (cells,) predicted objective (lower = predicted
            better), NaN where a cell has none; its Spearman with the measured scores is
            reported, signed so that positive means agreement.
        draws (>= 1), seed: the bootstrap. level: the interval's coverage in (0, 1).
    """
    t = np.asarray(table, dtype=float)
    mask = np.asarray(candidates, dtype=bool)
    if mask.shape != (t.shape[0],) or not mask.any():
        raise ValueError(f"candidates must be a boolean mask of the {t.shape[0]} cells with "
                         f"at least one True, got shape {mask.shape}")
    per = scores_per_draw(t, seed_draws(t.shape[2], draws, seed), better)
    fill = -np.inf if better == "max" else np.inf
    comp = np.where(mask[:, None] & ~np.isnan(per), per, fill)
    winner = comp.argmax(axis=0) if better == "max" else comp.argmin(axis=0)
    best = comp[winner, np.arange(comp.shape[1])]
    p_best = np.bincount(winner, minlength=t.shape[0]) / comp.shape[1]
    regrets = {name: interval(regret(per[i], best), level) for name, i in predictions.items()}
    sign = -1.0 if better == "max" else 1.0
    rho = {name: interval([spearman(np.asarray(obj, float), sign * per[:, d])
                           for d in range(per.shape[1])], level)
           for name, obj in (objectives or {}).items()}
    mode = int(np.argmax(p_best))
    versus = tuple(interval(regret(per[i], per[mode]), level) for i in range(per.shape[0]))
    return Verdict(p_best, mode, regrets, rho, comp.shape[1], versus)


def gate_distribution(table, better: str, halvings: int = 200, seed: int = 0,
                      level: float = 0.9) -> Interval:
    """The split-half gate over ``halvings`` random halvings of the seeds: interval of the
    Spearman between the two halves' cell scores (learning rate chosen within each half);
    ``replaytheory.stats.analysis.split_half_spearman`` is its mean over balanced splits."""
    t = np.asarray(table, dtype=float)
    halvings = checks.integer("halvings", halvings, 1)
    rng = np.random.default_rng(seed)
    values = [_one_split(t, rng.permutation(t.shape[2]), better) for _ in range(halvings)]
    return interval(values, level)


def _one_split(t: np.ndarray, order: np.ndarray, better: str) -> float:
    half = t.shape[2] // 2
    a = scores_per_draw(t, order[None, :half], better)[:, 0]
    b = scores_per_draw(t, order[None, half:2 * half], better)[:, 0]
    return spearman(a, b)


def leave_one_seed_out(table, better: str, groups) -> np.ndarray:
    """(groups, seeds) out-of-sample scores: for each seed s and each group (a list of cell
    indices, e.g. the cells of one horizon), the score on seed s of the (cell, learning rate)
    of the group whose median over the other seeds is best. NaN where that run is missing or
    the group has no run on the other seeds. Needs at least 2 seeds."""
    better = checks.choice("better", better, BETTER)
    t = np.asarray(table, dtype=float)
    n = t.shape[2]
    if n < 2:
        raise ValueError(f"leave-one-seed-out needs at least 2 seeds, got {n}")
    fill = -np.inf if better == "max" else np.inf
    out = np.full((len(groups), n), np.nan)
    for s in range(n):
        others = np.delete(np.arange(n), s)
        with warnings.catch_warnings():  # an option without runs on the other seeds: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(t[:, :, others], axis=2)  # (cells, lrs)
        for g, cells in enumerate(groups):
            if np.all(np.isnan(med[cells])):
                continue
            sub = np.where(np.isnan(med[cells]), fill, med[cells])
            flat = int(np.argmax(sub) if better == "max" else np.argmin(sub))
            i, j = np.unravel_index(flat, sub.shape)
            out[g, s] = t[cells[i], j, s]
    return out


@dataclass(frozen=True)
class PairedDifference:
    """Seed-by-seed difference of two out-of-sample scores, signed so that positive means the
    first is better: mean, central ``level`` Student-t interval of the mean (NaN with fewer
    than 2 finite differences, or if any is infinite), seeds compared and seeds the first won."""

    mean: float
    low: float
    high: float
    level: float
    seeds: int
    wins: int

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "level": self.level,
                "seeds": self.seeds, "wins": self.wins}


def paired_difference(a, b, better: str, level: float = 0.9) -> PairedDifference:
    """Compare per-seed scores ``a`` and ``b`` (same seeds; NaN pairs dropped): the
    difference a - b for scores to maximise, b - a for scores to minimise (compute to a
    target), with a Student-t interval at ``level`` in (0, 1) (theory.md section 8.3)."""
    better = checks.choice("better", better, BETTER)
    level = checks.real("level", level, 0.0, 1.0, lo_open=True, hi_open=True)
    a, b = np.asarray(a, float), np.asarray(b, float)
    keep = ~(np.isnan(a) | np.isnan(b))
    with np.errstate(invalid="ignore"):
        d = (a - b if better == "max" else b - a)[keep]
    d = d[~np.isnan(d)]  # inf - inf: both never reached the target, no comparison
    wins = int((d > 0).sum())
    if d.size == 0:
        return PairedDifference(math.nan, math.nan, math.nan, level, 0, 0)
    mean = float(np.mean(d))
    if d.size < 2 or not np.all(np.isfinite(d)):
        return PairedDifference(mean, math.nan, math.nan, level, int(d.size), wins)
    if np.all(d == d[0]):  # no spread: the t interval is the point itself
        return PairedDifference(mean, mean, mean, level, int(d.size), wins)
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(level)
    return PairedDifference(mean, float(ci.low), float(ci.high), level, int(d.size), wins)
