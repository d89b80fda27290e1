"""The cells of a sweep and their scores: which cells exist, and how each is scored at a mu.

Everything the validation, the claims report and the figures share: which cells exist (the
synchronous (x, y) grid, on-policy, positive bias, stale weights without replay), how a cell
is scored (best learning rate by the median over seeds), and the measured optimum.

Scores (theory.md section 3 for compute): ``compute_to_target`` at accuracy ``TARGET`` in
trainer-update units for a given mu (lower is better), and ``tail_accuracy`` (mean eval
accuracy over the last quarter of the run; higher is better).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from replaytheory.stats.analysis import best_option, median_iqr, split_half_spearman

from .results import Run, ScoreTable, by_cell

# Fixed before the sweep ran: the warm start sits at 0.31 and 300 steps reach 0.6-0.7.
TARGET = 0.55
# Fixed before the sweep ran: below it the grid disagrees with itself too much to judge a
# prediction.
GATE_THRESHOLD = 0.9


def kind(run: Run) -> str:
    """"on_policy", "grid" (sync, no positive bias), "delta" (sync, positive bias) or
    "lag" (stale weights, each rollout used once)."""
    mode = run.get("schedule.mode", "sync")
    if mode == "on_policy":
        return "on_policy"
    if mode == "async" and run.get("buffer.lifo", False):
        return "lag"
    if float(run.get("buffer.delta", 0.0)) > 0:
        return "delta"
    return "grid"


def xy(run: Run) -> tuple[float, float]:
    """(horizon x, replay ratio y) of a run; on-policy and lag runs are (1, 1)."""
    if kind(run) in ("on_policy", "lag"):
        return 1.0, 1.0
    return float(run.get("buffer.horizon")), float(run.get("schedule.replay_ratio"))


@dataclass
class CellScore:
    """A cell's score: median over seeds of its best learning rate, with the IQR."""

    cell: tuple
    runs: list
    kind: str
    horizon: float
    replay_ratio: float
    lr: float
    median: float
    q25: float
    q75: float
    values: np.ndarray

    @property
    def label(self) -> str:
        if self.kind == "on_policy":
            return "on-policy"
        if self.kind == "lag":
            return f"lag {self.runs[0].get('schedule.latency_steps')}"
        base = f"x={self.horizon:g}, y={self.replay_ratio:g}"
        if self.kind == "delta":
            return f"{base}, delta={self.runs[0].get('buffer.delta'):g}"
        return base


def cell_scores(runs: list[Run], score, better: str) -> list[CellScore]:
    """Score every cell: best learning rate by median (``better``: "min" or "max")."""
    t = ScoreTable.of(runs, score)
    best, idx = best_option(t.values, better)
    groups = by_cell(runs)
    out = []
    for i, cell in enumerate(t.cells):
        if idx[i] < 0:
            continue
        vals = t.values[i, idx[i]]
        med, lo, hi = median_iqr(vals)
        members = [r for r in groups[cell] if r.lr == t.lrs[idx[i]]]
        x, y = xy(members[0])
        out.append(CellScore(cell=cell, runs=members, kind=kind(members[0]), horizon=x,
                             replay_ratio=y, lr=t.lrs[idx[i]], median=float(med),
                             q25=float(lo), q75=float(hi), values=vals))
    return out


def compute_score(mu: float, target: float = TARGET):
    """Run -> compute to reach ``target`` accuracy at this mu (inf if never)."""
    return lambda run: run.compute_to_target(mu, target)


def tail_score(run: Run) -> float:
    return run.tail_accuracy(0.25)


def gate(runs: list[Run], score, better: str) -> float:
    """Split-half Spearman of the cells' scores, learning rate chosen within each half."""
    t = ScoreTable.of(runs, score)
    if len(t.seeds) < 2:
        return math.nan
    return split_half_spearman(t.values, better)


def best_cell(scores: list[CellScore], better: str, kinds=("grid",)) -> CellScore:
    """The best cell among the given kinds."""
    pool = [c for c in scores if c.kind in kinds]
    if not pool:
        raise ValueError(f"no cell of kinds {kinds} in the results")
    key = (lambda c: c.median) if better == "min" else (lambda c: -c.median)
    return min(pool, key=key)


def measured_mu(runs: list[Run]) -> float:
    """Median of the runs' time-measured mu (generation cost of a batch / update cost)."""
    vals = [r.summary.get("mu_measured") for r in runs if r.summary.get("mu_measured")]
    if not vals:
        raise ValueError("no run records mu_measured")
    return float(np.median(vals))
