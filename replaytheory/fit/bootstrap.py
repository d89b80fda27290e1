"""What every fit from probes shares (theory.md section 8): a probe table's rows, their
clusters (the rows of one probe step of one run share theta and the reference gradient, so a
bootstrap resamples them together), bootstrap weights over clusters, weighted least squares,
percentile intervals, R^2 and the test of a line through the origin. Used by ``bound_fit``,
``reuse_fit``, ``calibrate``, ``diagnosis`` and ``panel_fit``.
"""

from __future__ import annotations

import math

import numpy as np

from .probes import ProbeSet

CI_LEVEL = 0.95
P_VALUE_MIN = 0.01  # goodness-of-fit threshold below which a form is declared not to fit


def _interval(samples: np.ndarray) -> tuple[float, float]:
    s = samples[np.isfinite(samples)]
    if s.size == 0:
        return (math.nan, math.nan)
    lo, hi = np.percentile(s, [50 * (1 - CI_LEVEL), 50 * (1 + CI_LEVEL)])
    return (float(lo), float(hi))


def _table(probes, name: str, min_rows: int) -> dict[str, np.ndarray]:
    if not isinstance(probes, ProbeSet):
        raise ValueError(f"probes must be a ProbeSet, got {type(probes).__name__}")
    probes.validate()  # NaN, ragged or missing columns
    t = probes.tables[name]
    rows = probes.n_rows(name)
    if rows < min_rows:
        raise ValueError(f"probes.{name} must hold at least {min_rows} rows for a fit, got "
                         f"{rows}")
    for col, arr in t.items():
        if not np.all(np.isfinite(arr)):
            bad = arr[~np.isfinite(arr)][0]
            raise ValueError(f"probes.{name}.{col} must be finite, found {bad!r}")
    return t


def _cluster_ids(t: dict[str, np.ndarray]) -> np.ndarray:
    """Cluster id per row: one probe step of one run (``run`` column if present)."""
    run = t["run"] if "run" in t else np.zeros_like(t["probe_step"])
    _, ids = np.unique(np.stack([run, t["probe_step"]], 1), axis=0, return_inverse=True)
    return ids.ravel()


def _clusters(t: dict[str, np.ndarray], name: str, min_clusters: int) -> np.ndarray:
    ids = _cluster_ids(t)
    n = int(ids.max()) + 1
    if n < min_clusters:
        raise ValueError(f"probes.{name} must come from at least {min_clusters} probe steps for "
                         f"a bootstrap, got {n}")
    return ids


def _per_cluster(ids, bins, n_bins, *values):
    """Sums of each value per (cluster, bin): arrays of shape (clusters, bins)."""
    n_c = int(ids.max()) + 1
    flat = ids * n_bins + bins
    return [np.bincount(flat, weights=val, minlength=n_c * n_bins).reshape(n_c, n_bins)
            for val in values]


def _boot_weights(n_clusters: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot + 1, clusters) resampling counts; row 0 is the data itself."""
    rng = np.random.default_rng(seed)
    w = rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot)
    return np.vstack([np.ones(n_clusters), w]).astype(float)


def _wls(x, y, w, through_origin: bool):
    """Weighted least squares along the last axis; returns (slope, intercept)."""
    if through_origin:
        slope = np.sum(w * x * y, -1) / np.sum(w * x * x, -1)
        return slope, np.zeros_like(slope)
    sw = np.sum(w, -1)
    mx, my = np.sum(w * x, -1) / sw, np.sum(w * y, -1) / sw
    cov = np.sum(w * (x - mx[..., None]) * (y - my[..., None]), -1)
    var = np.sum(w * (x - mx[..., None]) ** 2, -1)
    slope = cov / var
    return slope, my - slope * mx


def _as_json(fit) -> dict:
    """A fit dataclass as JSON-ready values: tuples and arrays become lists."""
    def plain(val):
        if isinstance(val, dict):
            return {k: plain(x) for k, x in val.items()}
        if isinstance(val, (tuple, np.ndarray)):
            return np.asarray(val).tolist()
        return val
    return {k: plain(val) for k, val in fit.__dict__.items()}


def _origin_line_test(slope, icpt, quantity: str, driver: str):
    """Is y = b x (through the origin) supported: slope interval above 0, intercept interval
    containing 0? ``slope``/``icpt`` hold the data's value then bootstrap replicates.
    Returns (slope interval, intercept interval, reasons it is not)."""
    s_int, i_int = _interval(slope[1:]), _interval(icpt[1:])
    reasons = []
    if not s_int[0] > 0:
        reasons.append(f"the {quantity} does not grow with the {driver} (slope interval "
                       f"[{s_int[0]:.3g}, {s_int[1]:.3g}] reaches 0)")
    if not i_int[0] <= 0 <= i_int[1]:
        reasons.append(f"the {quantity} at zero {driver} is not 0 (intercept interval "
                       f"[{i_int[0]:.3g}, {i_int[1]:.3g}])")
    return s_int, i_int, reasons


def _r2(y, fitted, w) -> float:
    mean = np.sum(w * y) / np.sum(w)
    tot = np.sum(w * (y - mean) ** 2)
    return float(1 - np.sum(w * (y - fitted) ** 2) / tot) if tot > 0 else math.nan
