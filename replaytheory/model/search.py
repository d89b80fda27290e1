"""The searches behind every design (theory.md sections 5, 5.8 and 10): over the horizon x
alone when the best replay ratio y*(x) is known in closed form, over (x, y) otherwise.

Both work in log space (x and y span many decades) on a log objective, +inf where a point is
inadmissible: a grid first, so that a non-convex objective cannot trap a local method, then a
polish that is kept only if it does not worsen the grid's best point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize

# Search range of the horizon x (steps), in log space: wide enough for the on-policy corner
# of alpha just below 1/2 (x* ~ 1e-8) and for alpha near 0 (x* ~ 1e5 and beyond).
_LOG_X_LO, _LOG_X_HI = math.log(1e-30), math.log(1e15)
LOG_X_GRID = np.linspace(_LOG_X_LO, _LOG_X_HI, 1801)

# A box optimum this close (in log x or log y) to a side of the box lies on it.
_EDGE_TOL = 1e-6


def minimise_over_horizon(log_objective, x_max=math.inf):
    """argmin over x = e^u <= x_max (steps, > 0) of ``log_objective(u)`` (vectorised in u):
    ``LOG_X_GRID``, Brent's bounded method, then a first-order polish.

    Returns 0.0 when the infimum is at x -> 0 and ``x_max`` when the objective keeps falling.
    """
    def log_profile(u):
        val = log_objective(np.asarray(u, dtype=float))
        return np.where(np.isnan(val), np.inf, val)

    grid = LOG_X_GRID
    if math.isfinite(x_max):
        grid = np.append(grid[grid < math.log(x_max)], math.log(x_max))
    vals = log_profile(grid)
    i = int(np.argmin(vals))
    if vals[i] == -np.inf:
        # sigma_bar^2 vanishes (power law, discrete average, H <= 1): J = 0 on a whole
        # interval; return its right end, the longest horizon with zero objective.
        return float(np.exp(grid[np.flatnonzero(vals == -np.inf)[-1]]))
    if not np.isfinite(vals[i]):
        raise ValueError("the noise model gives no finite objective at any horizon")
    # Ties within rounding at an end of the range mean the profile is flat there (e.g. the
    # noise stops growing): report the limit rather than an arbitrary far-out grid point.
    capped = math.isfinite(x_max) and i == grid.size - 1
    if capped:
        # The cap is the last grid point: the optimum lies between its neighbour and the cap
        # (the polish below keeps whichever is lower, the cap included).
        lo, hi = grid[i - 1], grid[i]
    elif vals[-1] - vals[i] <= 1e-12:
        return x_max
    elif i == 0 or vals[0] - vals[i] <= 1e-12:
        return 0.0
    else:
        lo, hi = grid[i - 1], grid[i + 1]
    res = optimize.minimize_scalar(lambda u: float(log_profile(u)), bounds=(lo, hi),
                                   method="bounded", options={"xatol": 1e-12})
    best = float(res.x)
    h = 1e-6

    def slope(u):
        return float(log_profile(u + h) - log_profile(u - h)) / (2 * h)

    if capped and log_profile(hi) <= log_profile(best):
        best = hi
    try:
        if slope(lo) < 0 < slope(hi):
            root = optimize.brentq(slope, lo, hi, xtol=1e-14, rtol=1e-15)
            if log_profile(root) <= log_profile(best) + 1e-13:
                best = root
    except (ValueError, RuntimeError):
        pass
    return float(x_max) if capped and best == hi else float(math.exp(best))


@dataclass(frozen=True)
class SearchBox:
    """Where a two-dimensional search looks: horizon x in [x_lo, x_hi] (steps) and replay
    ratio y in [y_lo, y_hi], all > 0 with lo < hi."""

    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class BoxOptimum:
    """The minimiser found in a ``SearchBox``: x (steps) and y, and whether each lies on a
    side of the box (the objective may keep falling past it)."""

    horizon: float
    replay_ratio: float
    horizon_at_edge: bool
    ratio_at_edge: bool


def minimise_in_box(log_objective, box: SearchBox, *, points: int, xatol: float,
                    fatol: float, x_cap: float = math.inf) -> BoxOptimum | None:
    """argmin over ``box`` of ``log_objective(x, y)`` (vectorised; +inf where inadmissible):
    a ``points`` x ``points`` log grid, then Nelder-Mead in (log x, log y) from its best point
    with tolerances ``xatol`` (log units) and ``fatol``, kept only if it does not worsen.

    ``x_cap`` (steps, in (box.x_lo, box.x_hi] or inf): x past it is left out, the grid points
    past it dropped and the polish held at or below it; the box's x side is then the cap.
    Returns None when no grid point is finite.
    """
    if not x_cap > box.x_lo:
        raise ValueError(f"x_cap must be > box.x_lo = {box.x_lo:g}, got {x_cap!r}")
    ux = np.linspace(math.log(box.x_lo), math.log(box.x_hi), points)
    uy = np.linspace(math.log(box.y_lo), math.log(box.y_hi), points)
    gx, gy = np.meshgrid(np.exp(ux), np.exp(uy), indexing="ij")
    # The grid stays the whole box's: a cap that does not bind leaves the optimum as it was
    # (registrations made before the cap re-derive; theory.md 5.8).
    vals = np.where(gx <= x_cap, log_objective(gx, gy), np.inf)
    if not np.any(np.isfinite(vals)):
        return None
    i, j = np.unravel_index(int(np.argmin(vals)), vals.shape)
    lo, hi = np.array([ux[0], uy[0]]), np.array([min(ux[-1], math.log(x_cap)), uy[-1]])

    def obj(p):
        q = np.clip(p, lo, hi)
        return float(log_objective(math.exp(q[0]), math.exp(q[1])))

    start = np.array([ux[i], uy[j]])
    res = optimize.minimize(obj, start, method="Nelder-Mead",
                            options={"xatol": xatol, "fatol": fatol, "maxiter": 4000})
    best = np.clip(res.x, lo, hi) if obj(res.x) <= obj(start) else start
    edge = (best <= lo + _EDGE_TOL) | (best >= hi - _EDGE_TOL)
    return BoxOptimum(horizon=float(math.exp(best[0])), replay_ratio=float(math.exp(best[1])),
                      horizon_at_edge=bool(edge[0]), ratio_at_edge=bool(edge[1]))


__all__ = ["LOG_X_GRID", "SearchBox", "BoxOptimum", "minimise_over_horizon",
           "minimise_in_box"]
