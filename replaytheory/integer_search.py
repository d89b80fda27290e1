"""The integer search behind ``calculator.optimal_config`` (theory.md section 5.9).

The feasible set is a list of rows. A row fixes the batch B, the new rollouts per update R
(an average under a worker/trainer split) and so y = B/R and the cost of an update; the
buffer size N is free on a lattice lo, lo + step, ..., hi (N >= B, N a multiple of the
trainer count when the buffer is sharded, x = N/R within the horizon limit). J(x, y) is
minimised over every row:

* a row of at most ``ROW_SCAN`` lattice points is scanned entirely (exact for any model);
* a longer row is bracketed: ``ZOOM_POINTS`` evenly spaced lattice points, keep the two
  neighbours of the smallest, repeat until the bracket is short enough to scan. For a J that
  is unimodal in x at fixed y the minimum of the lattice always lies in the bracket, so the
  search is exact; section 5.3 shows unimodality for the power law with the continuous
  average, and section 10.3 for a constant self-correlation c. For other models (a measured
  table, a c(g) table, the discrete average) the long rows are searched, not proved.

``at_horizon`` instead keeps, in each row, the lattice points next to a given horizon (the
measured one, section 10.11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Rows with at most this many buffer sizes are scanned point by point.
ROW_SCAN = 512
# Lattice points per bracketing round of a longer row (>= 4 for the bracket to shrink).
ZOOM_POINTS = 64
# Rows evaluated together (one (rows x points) array stays at about 2 MB).
_CHUNK = 512


@dataclass(frozen=True)
class Rows:
    """The feasible set: row i holds batch[i], rollouts[i] = R (> 0), buffer sizes N on the
    lattice lo[i], lo[i] + step[i], ..., <= hi[i], and the cost of an update in trainer
    updates (section 3). ``horizon_bound``: True where hi is set by the horizon limit rather
    than by the buffer cap. ``workers``/``trainers`` are the split (None: synchronous)."""

    batch: np.ndarray
    rollouts: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    step: np.ndarray
    cost: np.ndarray
    horizon_bound: np.ndarray
    workers: np.ndarray | None = None
    trainers: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.batch.size)

    def where(self, keep: np.ndarray) -> "Rows":
        """The rows where ``keep`` is True."""
        pick = {k: (None if val is None else val[keep]) for k, val in self.__dict__.items()}
        return Rows(**pick)

    @property
    def replay_ratio(self) -> np.ndarray:
        """y = B/R per row."""
        return self.batch / self.rollouts


@dataclass(frozen=True)
class RowMinima:
    """The best buffer size of each row and J there (inf where a row has no candidate)."""

    buffer_size: np.ndarray
    objective: np.ndarray


def _lattice_top(lo, step, top):
    """Largest lo + k step <= top (lo itself if top < lo; the caller drops such rows)."""
    return lo + np.maximum(np.floor((top - lo) / step + 1e-9), -1).astype(np.int64) * step


def sync_rows(batches, *, mu: float, buffer_cap: float, horizon_limit: float,
              max_rollouts_per_batch: int = 10) -> Rows:
    """Rows of the synchronous design: every integer R in [1, 10 B] per batch B, N in
    [max(B, R), min(buffer_cap, horizon_limit R)]; cost 1 + mu R/B (section 3).

    R > 10 B (y < 0.1: ten batches generated per update, one trained on) is left out.
    """
    bs, rs = [], []
    for b in batches:
        r = np.arange(1, max_rollouts_per_batch * b + 1)
        bs.append(np.full(r.size, b))
        rs.append(r)
    b, r = np.concatenate(bs), np.concatenate(rs).astype(float)
    lo = np.maximum(b, r).astype(np.int64)
    step = np.ones_like(lo)
    top = np.minimum(buffer_cap, horizon_limit * r * (1 + 1e-12))
    hi = _lattice_top(lo, step, top)
    return _feasible(Rows(batch=b, rollouts=r, lo=lo, hi=hi, step=step, cost=1 + mu * r / b,
                          horizon_bound=horizon_limit * r < buffer_cap))


def async_rows(batches, *, mu: float, gpus: int, trainers: int | None, divisible: bool,
               buffer_cap: float, horizon_limit: float) -> Rows:
    """Rows of the asynchronous design: each split T = 1..G-1 (or the given T), W = G - T,
    sets y = mu T/W (section 3.3), R = B/y; N >= max(B, R) (x >= 1: a shorter buffer drops
    rollouts unseen, and x < 1 is section 5.7's on-policy regime) and, if ``divisible``, B
    and N multiples of T; x = N/R <= horizon_limit; cost 1 + W/T."""
    splits = [trainers] if trainers is not None else range(1, gpus)
    cols = {k: [] for k in ("batch", "rollouts", "lo", "step", "workers", "trainers")}
    for t in splits:
        step = t if divisible else 1
        for b in batches:
            if b % step:
                continue
            r = b * (gpus - t) / (mu * t)
            cols["batch"].append(b)
            cols["rollouts"].append(r)
            cols["lo"].append(-(-max(b, math.ceil(r - 1e-9)) // step) * step)
            cols["step"].append(step)
            cols["workers"].append(gpus - t)
            cols["trainers"].append(t)
    a = {k: np.asarray(val, dtype=float if k == "rollouts" else np.int64)
         for k, val in cols.items()}
    top = np.minimum(buffer_cap, horizon_limit * a["rollouts"] * (1 + 1e-12))
    return _feasible(Rows(**a, hi=_lattice_top(a["lo"], a["step"], top),
                          cost=1 + a["workers"] / np.maximum(a["trainers"], 1),
                          horizon_bound=horizon_limit * a["rollouts"] < buffer_cap))


def _feasible(rows: Rows) -> Rows:
    """The rows with at least one buffer size."""
    return rows.where(rows.lo <= rows.hi)


def minimise_rows(score, rows: Rows, lower_bound: np.ndarray | None = None,
                  incumbent: float = math.inf) -> RowMinima:
    """The lattice minimum of J in every row; ``score(x, y)`` is J, vectorised.

    Branch and bound: with ``lower_bound`` (a valid lower bound on J over each row), rows
    are searched in order of their bound, and a row whose bound is not below the best J
    found so far (``incumbent`` to start with, e.g. on-policy's J) is skipped: its objective
    is returned as inf. The overall minimum is unchanged.
    """
    n_out = rows.lo.copy()
    j_out = np.full(len(rows), np.inf)
    bound = np.full(len(rows), -np.inf) if lower_bound is None else lower_bound
    order = np.argsort(bound, kind="stable")
    for s in range(0, len(rows), _CHUNK):
        part = order[s:s + _CHUNK]
        part = part[bound[part] < incumbent]
        if not part.size:
            break  # the bounds are sorted: every later row is pruned too
        n_out[part], j_out[part] = _minimise_chunk(score, rows.rollouts[part],
                                                   rows.replay_ratio[part], rows.lo[part],
                                                   rows.hi[part], rows.step[part])
        incumbent = min(incumbent, float(j_out[part].min()))
    return RowMinima(buffer_size=n_out, objective=j_out)


def _evaluate(score, r, y, n):
    """J at buffer sizes n (rows x points), inf where not finite."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        val = np.asarray(score(n / r[:, None], np.broadcast_to(y[:, None], n.shape)), float)
    return np.where(np.isfinite(val), val, np.inf)


def _minimise_chunk(score, r, y, lo, hi, step):
    """Bracket-and-scan on lattice indices k (N = lo + k step), all rows at once: the first
    round takes ``ROW_SCAN`` points, the later ones ``ZOOM_POINTS``."""
    a = np.zeros(lo.size, dtype=np.int64)
    b = (hi - lo) // step
    best_k, best_j = np.zeros_like(a), np.full(lo.size, np.inf)
    idx = np.arange(lo.size)
    points = min(ROW_SCAN, int(b.max()) + 1)
    while True:
        width = b - a
        scan = width < points
        frac = np.linspace(0.0, 1.0, points)
        k_zoom = a[:, None] + np.rint(frac[None, :] * width[:, None]).astype(np.int64)
        k_scan = np.minimum(a[:, None] + np.arange(points)[None, :], b[:, None])
        k = np.where(scan[:, None], k_scan, k_zoom)
        vals = _evaluate(score, r, y, lo[:, None] + k * step[:, None])
        j = np.argmin(vals, axis=1)
        better = vals[idx, j] < best_j
        best_k = np.where(better, k[idx, j], best_k)
        best_j = np.where(better, vals[idx, j], best_j)
        if scan.all():
            return lo + best_k * step, best_j
        # Unimodal in k: the lattice minimum lies between the smallest point's neighbours.
        a = np.where(scan, b, k[idx, np.maximum(j - 1, 0)])
        b = np.where(scan, b, k[idx, np.minimum(j + 1, points - 1)])
        points = min(ZOOM_POINTS, int((b - a).max()) + 1)


def at_horizon(score, rows: Rows, horizon: float) -> RowMinima:
    """In each row the lattice point next to N = horizon R (below and above) with the lower
    J; rows where neither lies in [lo, hi] get J = inf."""
    target = (horizon * rows.rollouts - rows.lo) / rows.step
    below = np.floor(target + 1e-9).astype(np.int64)
    k = np.stack([below, below + 1], axis=1)
    top = ((rows.hi - rows.lo) // rows.step)[:, None]
    inside = (k >= 0) & (k <= top)
    n = rows.lo[:, None] + np.clip(k, 0, top) * rows.step[:, None]
    vals = np.where(inside, _evaluate(score, rows.rollouts, rows.replay_ratio, n), np.inf)
    j = np.argmin(vals, axis=1)
    idx = np.arange(len(rows))
    return RowMinima(buffer_size=n[idx, j], objective=vals[idx, j])


def nearest_horizon(rows: Rows, horizon: float) -> RowMinima:
    """Per row the lattice N whose x = N/R is nearest ``horizon`` in log scale, with
    objective = |log(x / horizon)| (a distance, not J): for when no row reaches it."""
    n = np.clip(np.rint(horizon * rows.rollouts / rows.step) * rows.step, rows.lo, rows.hi)
    n = (rows.lo + ((n - rows.lo) // rows.step) * rows.step).astype(np.int64)
    return RowMinima(buffer_size=n, objective=np.abs(np.log(n / rows.rollouts / horizon)))


__all__ = ["ROW_SCAN", "ZOOM_POINTS", "Rows", "RowMinima", "sync_rows", "async_rows",
           "minimise_rows", "at_horizon", "nearest_horizon"]
