"""Which loss the advice names (theory.md section 13.1): grpo, the PPO clip, unless a
stale-rollout loss measurably beats it at the advised horizon on the registered loss grids
(section 12.3).

The evidence (``LOSS_EVIDENCE_PATH``, written by ``python -m replaytheory.evidence``) holds,
per loss grid (setting, run length T in trainer updates, learning rate, replay ratio y), per
(loss, horizon x) cell, the AUC of each seed: mean eval accuracy over the run's evaluations.

The rule, fixed before the loss grids were judged: with fresh rollouts every importance ratio
is 1 and the losses coincide, so on-policy advice names grpo. Otherwise, in each grid take
the x nearest the advised horizon (log distance) and, per loss L != grpo measured there on at
least ``MIN_SEEDS`` seeds shared with grpo, the paired difference AUC(L) - AUC(grpo) with its
95% seed-bootstrap interval. L qualifies when its mean difference is >= 0 in every grid that
measured it and its interval lies above 0 in at least one; of those the largest mean
difference (averaged over the grids) is named. Otherwise grpo: the clip is what the measured
grids were run with, and without it training lost 0.09-0.13 AUC (section 11.19).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .stats.verdicts import seed_draws

LOSS_EVIDENCE_PATH = Path(__file__).resolve().parent / "data" / "loss_evidence.json"
DEFAULT_LOSS = "grpo"
MIN_SEEDS = 3  # fewer shared seeds give no interval worth the name
DRAWS = 4000  # bootstrap draws of the seeds


@dataclass(frozen=True)
class LossGrid:
    """One loss grid: its setting, run length T (updates), learning rate, replay ratio y,
    and per (loss, x) the AUC per seed (``{(loss, x): {seed: auc}}``)."""

    setting: str
    run_updates: int
    lr: float
    replay_ratio: float
    cells: dict

    @classmethod
    def from_record(cls, r: dict) -> "LossGrid":
        cells = {(c["loss"], float(c["x"])): dict(zip(c["seeds"], c["auc"])) for c in r["cells"]}
        return cls(r["setting"], int(r["run_updates"]), float(r["lr"]),
                   float(r["replay_ratio"]), cells)

    def nearest_horizon(self, x: float) -> float:
        """The grid's x nearest ``x`` (> 0, updates) in log distance; of two, the longer."""
        xs = sorted({h for _, h in self.cells})
        return min(xs, key=lambda h: (abs(math.log(h / x)), -h))


@dataclass(frozen=True)
class LossComparison:
    """AUC(loss) - AUC(grpo) at horizon x on one grid, paired by seed: the mean and its 95%
    seed-bootstrap interval (accuracy points), over ``seeds`` shared seeds."""

    loss: str
    setting: str
    horizon: float
    mean: float
    low: float
    high: float
    seeds: int


def load_loss_evidence(path: str | Path = LOSS_EVIDENCE_PATH) -> list[LossGrid]:
    """The loss grids of ``path`` (a JSON list, ``evidence.collect_losses``); none if absent."""
    path = Path(path)
    return [LossGrid.from_record(r) for r in json.loads(path.read_text())] if path.exists() else []


@dataclass(frozen=True)
class PairedDifference:
    """Mean of a - b over ``seeds`` shared seeds and its 95% seed-bootstrap interval
    [low, high] (the units of a and b)."""

    mean: float
    low: float
    high: float
    seeds: int


def paired_interval(a: dict, b: dict) -> PairedDifference | None:
    """a - b paired by seed (``{seed: value}`` each) over the seeds both hold; None below
    ``MIN_SEEDS`` shared seeds."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < MIN_SEEDS:
        return None
    d = np.array([a[s] - b[s] for s in seeds], float)
    boots = d[seed_draws(len(seeds), DRAWS, 0)].mean(1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    return PairedDifference(float(d.mean()), float(lo), float(hi), len(seeds))


def compare_losses(horizon: float, grids: list[LossGrid]) -> list[LossComparison]:
    """Every loss against grpo at the grid x nearest ``horizon`` (> 1 updates), per grid."""
    out = []
    for g in grids:
        x = g.nearest_horizon(horizon)
        base = g.cells.get((DEFAULT_LOSS, x), {})
        for loss in sorted({k for k, h in g.cells if h == x and k != DEFAULT_LOSS}):
            p = paired_interval(g.cells[(loss, x)], base)
            if p is not None:
                out.append(LossComparison(loss, g.setting, x, p.mean, p.low, p.high, p.seeds))
    return out


def choose_loss(horizon: float, replay_ratio: float,
                grids: list[LossGrid]) -> tuple[str, tuple[LossComparison, ...]]:
    """(The loss to name, the comparisons it was chosen from) for advice at ``horizon`` x and
    ``replay_ratio`` y (on-policy when both <= 1) by the module's rule."""
    if horizon <= 1.0 and replay_ratio <= 1.0:
        return DEFAULT_LOSS, ()
    comparisons = tuple(compare_losses(horizon, grids))
    by_loss: dict[str, list[LossComparison]] = {}
    for c in comparisons:
        by_loss.setdefault(c.loss, []).append(c)
    qualified = {loss: float(np.mean([c.mean for c in cs])) for loss, cs in by_loss.items()
                 if all(c.mean >= 0 for c in cs) and any(c.low > 0 for c in cs)}
    if not qualified:
        return DEFAULT_LOSS, comparisons
    return max(sorted(qualified), key=qualified.get), comparisons


def describe(loss: str, comparisons: tuple[LossComparison, ...]) -> str:
    """One line on where the named loss comes from, with the numbers."""
    if not comparisons:
        return (f"{loss}: no loss compared at this horizon (on-policy advice, or no loss "
                f"grid with {MIN_SEEDS}+ seeds); the clip pays for itself (theory.md 11.19)")
    best = max(comparisons, key=lambda c: c.mean)
    shown = best if loss == DEFAULT_LOSS else max(
        (c for c in comparisons if c.loss == loss), key=lambda c: c.low)
    verdict = "no loss beats grpo; the closest" if loss == DEFAULT_LOSS else "beats grpo"
    return (f"measured (theory.md 13.1): {verdict}: {shown.loss} minus grpo at x = "
            f"{shown.horizon:g} on {shown.setting}: {shown.mean:+.3f} "
            f"[{shown.low:+.3f}, {shown.high:+.3f}] over {shown.seeds} seeds")
