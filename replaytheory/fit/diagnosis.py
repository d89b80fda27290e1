"""The corrected diagnosis of stale and reused samples (theory.md section 8.9).

Probes measure a sample's noise at one step, but a buffer rollout is both stale (generated s
steps ago) and reused (trained on u times already), and in a buffer the two grow together.
These estimators separate them, from a ``ProbeSet`` (layout in ``probes``):

* ``noise_regression``: sq noise = a + b_s staleness + b_u uses, jointly (section 8.9.1).
* ``noise_grid``: mean sq noise per (staleness bin, uses bin): along a row, noise by
  staleness at fixed uses; along a column, by uses at fixed staleness (section 8.9.1).
* ``self_correlation``: how correlated one rollout's noise is with itself g steps apart, from
  the ``reuse`` table (section 8.9.2): a reused sample is not a new noise draw.
* ``contribution_grid``: clip fraction, kept share of the gradient and importance weight per
  (staleness bin, uses bin), from the ``contribution`` table (section 8.9.3).
* ``buffer_bias``: the stale bias of buffer rows as a norm ratio ||bias|| / ||grad F|| and a
  cosine with grad F (section 8.9.4).

Every squared noise is net of the reference error (``ref_sq_error``, section 8.2). Intervals
are 95% percentile intervals of a cluster bootstrap over probes: a cluster is one
(run, probe_step), whose rows share theta and the reference gradient. Each function returns
a frozen dataclass (``to_dict`` gives JSON-ready values); too few rows or probes raise
``ValueError`` naming the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from .. import checks
from .bootstrap import _boot_weights, _clusters, _interval, _table
from .probes import UNIT_GROUP, UNIT_SEQUENCE, ProbeSet

UNITS = (UNIT_SEQUENCE, UNIT_GROUP)


@dataclass(frozen=True)
class Estimate:
    """A value and its 95% bootstrap interval (low, high), in the value's units."""

    value: float
    low: float
    high: float

    @classmethod
    def of(cls, replicates: np.ndarray) -> "Estimate":
        """From an array whose first entry is the data's value, the rest bootstrap
        replicates."""
        lo, hi = _interval(np.asarray(replicates[1:], dtype=float))
        return cls(float(replicates[0]), lo, hi)

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high}


def _rows(probes: ProbeSet, name: str, unit: int, need: tuple[str, ...], min_rows: int,
          keep=None) -> dict[str, np.ndarray]:
    """The rows of table ``name`` in ``unit`` (and ``keep(table)``), with columns ``need``."""
    checks.choice("unit", unit, UNITS)
    t = _table(probes, name, 0)
    missing = [c for c in need if c not in t]
    if missing:
        raise ValueError(f"probes.{name} lacks columns {missing} (a run with the reuse probes "
                         f"of llm_experiments writes them)")
    sel = t["unit"] == unit
    if keep is not None:
        sel &= keep(t)
    t = {c: col[sel] for c, col in t.items()}
    if int(sel.sum()) < min_rows:
        raise ValueError(f"probes.{name} must hold at least {min_rows} rows of unit {unit} "
                         f"for this estimate, got {int(sel.sum())}")
    return t


def _cell_sums(ids, cells, n_cells, *values) -> list[np.ndarray]:
    """Sums of each value per (cluster, cell): arrays (clusters, cells)."""
    n_c = int(ids.max()) + 1
    flat = ids * n_cells + cells
    return [np.bincount(flat, weights=val, minlength=n_c * n_cells).reshape(n_c, n_cells)
            for val in values]


def _bin(values: np.ndarray, edges, name: str) -> np.ndarray:
    """Bin index per value for half-open bins [e_k, e_{k+1}); -1 outside."""
    e = np.asarray(edges, dtype=float)
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise ValueError(f"{name} must be an increasing list of >= 2 bin edges, got {edges!r}")
    idx = np.searchsorted(e, values, side="right") - 1
    return np.where((idx >= 0) & (idx < e.size - 1), idx, -1)


# ---- noise: staleness against uses ---------------------------------------------------------

@dataclass(frozen=True)
class NoiseRegression:
    """The joint fit sq_noise - ref_sq_error = intercept + per_step s + per_use u over noise
    rows of one unit (squared gradient units; per_step per step of staleness, per_use per
    earlier training use). spearman: rank correlation of staleness and uses over the rows
    (their confounding, in [-1, 1]). n_rows, n_probes: rows and clusters used."""

    intercept: Estimate
    per_step: Estimate
    per_use: Estimate
    spearman: float
    n_rows: int
    n_probes: int
    unit: int

    def to_dict(self) -> dict:
        return _as_json_nested(self)


def noise_regression(probes: ProbeSet, *, unit: int = UNIT_SEQUENCE, n_boot: int = 400,
                     seed: int = 0, min_probes: int = 3) -> NoiseRegression:
    """Regress the squared noise on staleness and uses jointly (theory.md section 8.9.1).

    Ordinary least squares per bootstrap replicate, rows weighted by how often their probe
    was drawn. Needs the ``uses`` column of the noise table, >= 4 rows of ``unit`` (0
    sequence, 1 group) from >= ``min_probes`` probes, and staleness and uses that are not
    collinear. n_boot >= 20 replicates, ``seed`` their stream.
    """
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _rows(probes, "noise", unit, ("uses",), 4)
    ids = _clusters(t, "noise", checks.integer("min_probes", min_probes, 2))
    y = t["sq_noise"] - t["ref_sq_error"]
    x = np.stack([np.ones_like(y), t["staleness"], t["uses"]], 1)
    if np.linalg.matrix_rank(x) < 3:
        raise ValueError("probes.noise: staleness and uses are collinear (or constant), so "
                         "their effects cannot be separated")
    w = _boot_weights(int(ids.max()) + 1, n_boot, seed)[:, ids]
    coef = np.empty((w.shape[0], 3))
    for b, wb in enumerate(w):
        xtw = x.T * wb
        coef[b] = np.linalg.lstsq(xtw @ x, xtw @ y, rcond=None)[0]
    rho = stats.spearmanr(t["staleness"], t["uses"]).statistic
    return NoiseRegression(Estimate.of(coef[:, 0]), Estimate.of(coef[:, 1]),
                           Estimate.of(coef[:, 2]), float(rho), len(y),
                           int(ids.max()) + 1, unit)


@dataclass(frozen=True)
class Grid:
    """Per-cell estimates over (staleness bin, uses bin): bins [e_k, e_{k+1}) of
    ``staleness_edges`` (steps) and ``uses_edges`` (uses). For each quantity, ``value``,
    ``low``, ``high`` are (staleness bins, uses bins) arrays (NaN where a cell is empty);
    ``n`` counts the rows per cell. A row of a grid is a cross-section at fixed staleness
    (by uses), a column one at fixed uses (by staleness)."""

    staleness_edges: np.ndarray
    uses_edges: np.ndarray
    n: np.ndarray
    quantities: dict
    unit: int

    def to_dict(self) -> dict:
        return _as_json_nested(self)


def _grid(t, ids, staleness_edges, uses_edges, ratios: dict, n_boot, seed, unit) -> Grid:
    """Ratios of summed columns per (staleness bin, uses bin) with bootstrap intervals.
    ``ratios``: name -> (numerator per row, denominator per row)."""
    sb = _bin(t["staleness"], staleness_edges, "staleness_edges")
    ub = _bin(t["uses"], uses_edges, "uses_edges")
    n_s, n_u = len(staleness_edges) - 1, len(uses_edges) - 1
    ok = (sb >= 0) & (ub >= 0)
    cells = np.where(ok, sb * n_u + ub, 0)
    wts = _boot_weights(int(ids.max()) + 1, n_boot, seed)
    count = _cell_sums(ids, cells, n_s * n_u, ok.astype(float))[0]
    out = {}
    for name, (num, den) in ratios.items():
        sn, sd = _cell_sums(ids, cells, n_s * n_u, np.where(ok, num, 0.0), np.where(ok, den, 0))
        with np.errstate(invalid="ignore", divide="ignore"):
            r = (wts @ sn) / (wts @ sd)
        lo_hi = np.array([_interval(r[1:, c]) for c in range(r.shape[1])])
        out[name] = {"value": r[0].reshape(n_s, n_u), "low": lo_hi[:, 0].reshape(n_s, n_u),
                     "high": lo_hi[:, 1].reshape(n_s, n_u)}
    return Grid(np.asarray(staleness_edges, float), np.asarray(uses_edges, float),
                count.sum(0).reshape(n_s, n_u), out, unit)


def noise_grid(probes: ProbeSet, staleness_edges, uses_edges, *, unit: int = UNIT_SEQUENCE,
               n_boot: int = 400, seed: int = 0, min_probes: int = 3) -> Grid:
    """Mean squared noise net of the reference error, ``sq_noise`` (squared gradient units),
    per (staleness bin, uses bin) (theory.md section 8.9.1): noise by staleness at fixed
    uses, and by uses at fixed staleness. Edges: increasing lists (>= 2 entries)."""
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _rows(probes, "noise", unit, ("uses",), 1)
    ids = _clusters(t, "noise", checks.integer("min_probes", min_probes, 2))
    y = t["sq_noise"] - t["ref_sq_error"]
    return _grid(t, ids, staleness_edges, uses_edges, {"sq_noise": (y, np.ones_like(y))},
                 n_boot, seed, unit)


# ---- reuse: one rollout's noise at two steps ----------------------------------------------

@dataclass(frozen=True)
class SelfCorrelation:
    """Correlation of one rollout's noise with itself ``gap`` steps apart (theory.md section
    8.9.2): per gap (steps), sum(inner) / sqrt(sum(sq_now) sum(sq_then)) over the ``reuse``
    rows of that gap, in [-1, 1]; 1 = the reused sample repeats the same noise, 0 = a new
    draw. ``corr``: one Estimate per gap; ``n_rows``, ``n_probes`` per gap."""

    gap: np.ndarray
    corr: list
    n_rows: np.ndarray
    n_probes: np.ndarray
    unit: int

    def to_dict(self) -> dict:
        return _as_json_nested(self)


def self_correlation(probes: ProbeSet, *, unit: int = UNIT_SEQUENCE, n_boot: int = 400,
                     seed: int = 0, min_probes: int = 2) -> SelfCorrelation:
    """The self-correlation of a rollout's noise by gap, from the ``reuse`` table (theory.md
    section 8.9.2), with cluster-bootstrap intervals. Needs >= 1 row of ``unit`` and
    >= ``min_probes`` probes."""
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _rows(probes, "reuse", unit, (), 1)
    ids = _clusters(t, "reuse", checks.integer("min_probes", min_probes, 1))
    gaps, gi = np.unique(t["gap"], return_inverse=True)
    inner, now, then, cnt = _cell_sums(ids, gi, gaps.size, t["inner"], t["sq_now"],
                                       t["sq_then"], np.ones_like(t["inner"]))
    wts = _boot_weights(int(ids.max()) + 1, n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (wts @ inner) / np.sqrt((wts @ now) * (wts @ then))
    return SelfCorrelation(gaps, [Estimate.of(corr[:, k]) for k in range(gaps.size)],
                           cnt.sum(0), (cnt > 0).sum(0), unit)


# ---- contribution of a stale or reused sample ---------------------------------------------

def contribution_grid(probes: ProbeSet, staleness_edges, uses_edges, *,
                      unit: int = UNIT_SEQUENCE, n_boot: int = 400, seed: int = 0,
                      min_probes: int = 2) -> Grid:
    """Per (staleness bin, uses bin) (theory.md section 8.9.3): ``clip_fraction`` (mean share
    of clipped tokens, [0, 1]), ``contribution`` (pooled kept share of the unclipped gradient,
    sum(contribution sq_unclip) / sum(sq_unclip) where the table has ``sq_unclip``, else the
    mean; 1 = fully kept) and ``is_weight`` (mean importance weight)."""
    n_boot = checks.integer("n_boot", n_boot, 20)
    t = _rows(probes, "contribution", unit, (), 1)
    ids = _clusters(t, "contribution", checks.integer("min_probes", min_probes, 1))
    one = np.ones_like(t["contribution"])
    weight = t.get("sq_unclip", one)
    ratios = {"clip_fraction": (t["clip_fraction"], one),
              "contribution": (t["contribution"] * weight, weight),
              "is_weight": (t["is_weight"], one)}
    return _grid(t, ids, staleness_edges, uses_edges, ratios, n_boot, seed, unit)


# ---- the stale bias of buffer rows ---------------------------------------------------------

@dataclass(frozen=True)
class BufferBias:
    """Stale bias of buffer rows (theory.md section 8.9.4), pooled over the bias rows of each
    staleness bin [e_k, e_{k+1}) of ``staleness_edges`` and over all of them (``all_*``):

    norm_ratio: sqrt(sum ||bias||^2 / sum ||grad F||^2), >= 0 (a norm ratio, not squared; 0
    where the debiased sum is negative). cosine: sum <bias, grad F> / sqrt(sum ||bias||^2
    sum ||grad F||^2), in [-1, 1] up to noise (NaN where the bias sum is <= 0).
    raw_cos_grad: the plain mean of the rows' cos_grad (cosine of the noisy mean with g_ref),
    for comparison: uncorrected, the reference error pulls it below 0 (the mean carries
    -e_ref) and the samples' noise towards 0.
    n_rows, n_probes: rows (a row: one staleness at one probe, >= 2 samples) and clusters.
    """

    staleness_edges: np.ndarray
    norm_ratio: list
    cosine: list
    n_rows: np.ndarray
    all_norm_ratio: Estimate
    all_cosine: Estimate
    raw_cos_grad: Estimate
    n_probes: int
    unit: int

    def to_dict(self) -> dict:
        return _as_json_nested(self)


def buffer_bias(probes: ProbeSet, staleness_edges, *, unit: int = UNIT_GROUP,
                n_boot: int = 400, seed: int = 0, min_probes: int = 3) -> BufferBias:
    """Estimate the bias of stale buffer samples from the ``bias`` rows measured on the buffer
    (``method`` 0 where that column exists) with n_samples >= 2 (theory.md section 8.9.4).

    Per row (n samples at one staleness), ||bias||^2 = (mean_sq - noise_sq / n) / (1 - 1/n)
    - ref_sq_error (section 8.2), ||grad F||^2 = grad_sq - ref_sq_error, and
    <bias, grad F> = cos_grad sqrt(mean_sq grad_sq) + ref_sq_error: the samples' noise is
    measured against g_ref = grad F + e_ref, so their mean carries -e_ref, and
    E <mean, g_ref> = <bias, grad F> - ||e_ref||^2.
    """
    n_boot = checks.integer("n_boot", n_boot, 20)

    def buffer_rows(t):
        method = t.get("method", np.zeros_like(t["unit"]))
        return (method == 0) & (t["n_samples"] >= 2)
    t = _rows(probes, "bias", unit, (), 2, buffer_rows)
    ids = _clusters(t, "bias", checks.integer("min_probes", min_probes, 2))
    n = t["n_samples"]
    b2 = (t["mean_sq"] - t["noise_sq"] / n) / (1 - 1 / n) - t["ref_sq_error"]
    g2 = t["grad_sq"] - t["ref_sq_error"]
    inner = t["cos_grad"] * np.sqrt(t["mean_sq"] * t["grad_sq"]) + t["ref_sq_error"]
    sb = _bin(t["staleness"], staleness_edges, "staleness_edges")
    k = len(staleness_edges) - 1
    ok = sb >= 0
    cells = np.where(ok, sb, k)  # bin k: the rows outside every bin (kept for all_*)
    sums = _cell_sums(ids, cells, k + 1, b2, g2, inner, t["cos_grad"], np.ones_like(b2))
    wts = _boot_weights(int(ids.max()) + 1, n_boot, seed)
    sb2, sg2, sin, scos, cnt = [wts @ s for s in sums]

    def ratio_cos(b, g, i):
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.sqrt(np.clip(b, 0, None) / g)
            cos = np.where(b > 0, i / np.sqrt(np.clip(b, 0, None) * g), np.nan)
        return ratio, cos
    ratio, cos = ratio_cos(sb2[:, :k], sg2[:, :k], sin[:, :k])
    all_ratio, all_cos = ratio_cos(sb2.sum(1), sg2.sum(1), sin.sum(1))
    return BufferBias(np.asarray(staleness_edges, float),
                      [Estimate.of(ratio[:, j]) for j in range(k)],
                      [Estimate.of(cos[:, j]) for j in range(k)], cnt[0, :k],
                      Estimate.of(all_ratio), Estimate.of(all_cos),
                      Estimate.of(scos.sum(1) / cnt.sum(1)), int(ids.max()) + 1, unit)


# Default bins: staleness in steps of a buffer of horizon 16, uses of a replay ratio near 2.
STALENESS_EDGES = (0, 1, 4, 8, 12, 16)
USES_EDGES = (0, 1, 2, 3, 5, 64)


@dataclass(frozen=True)
class Diagnosis:
    """All estimates of section 8.9 from one set of probes: the joint regression and the
    noise grid (sequence rows; ``regression_group`` on group rows), the self-correlation by
    gap (sequences and groups), the contribution grid (sequences) and the buffer bias. An
    estimate whose rows the probes do not hold (e.g. probes made before the ``reuse`` and
    ``contribution`` tables existed, or too few probe steps for a bootstrap) is None, with
    the reason in ``skipped`` (estimate name -> reason)."""

    regression: NoiseRegression | None
    regression_group: NoiseRegression | None
    noise: Grid | None
    self_corr: SelfCorrelation | None
    self_corr_group: SelfCorrelation | None
    contribution: Grid | None
    bias: BufferBias | None
    skipped: dict

    def to_dict(self) -> dict:
        return {k: rec if k == "skipped" else None if rec is None else rec.to_dict()
                for k, rec in self.__dict__.items()}


def _holds(probes: ProbeSet, name: str, unit: int, column: str | None = None) -> bool:
    """Whether table ``name`` has rows of ``unit`` (and the optional ``column``)."""
    t = probes.tables.get(name, {})
    if column is not None and column not in t:
        return False
    return bool(np.any(np.asarray(t.get("unit", np.zeros(0))) == unit))


def diagnose(probes: ProbeSet, *, staleness_edges=STALENESS_EDGES, uses_edges=USES_EDGES,
             n_boot: int = 400, seed: int = 0) -> Diagnosis:
    """Every estimator of this module that ``probes`` hold rows for (the regression and the
    noise grid need the ``uses`` column; the self-correlation the ``reuse`` table; the
    contribution the ``contribution`` table; the bias buffer rows of the ``bias`` table),
    with shared bins, replicates and seed; the others are None."""
    kw = {"n_boot": n_boot, "seed": seed}
    seq, grp = UNIT_SEQUENCE, UNIT_GROUP
    skipped = {}

    def when(name, ok, fn, *args, **extra):
        if not ok:
            skipped[name] = "the probes hold no rows for it"
            return None
        try:
            return fn(probes, *args, **extra, **kw)
        except ValueError as exc:  # too few rows or probe steps for this estimate
            skipped[name] = str(exc)
            return None

    has_uses = _holds(probes, "noise", seq, "uses")
    fields = dict(
        regression=when("regression", has_uses, noise_regression, unit=seq),
        regression_group=when("regression_group", _holds(probes, "noise", grp, "uses"),
                              noise_regression, unit=grp),
        noise=when("noise", has_uses, noise_grid, staleness_edges, uses_edges),
        self_corr=when("self_corr", _holds(probes, "reuse", seq), self_correlation, unit=seq),
        self_corr_group=when("self_corr_group", _holds(probes, "reuse", grp),
                             self_correlation, unit=grp),
        contribution=when("contribution", _holds(probes, "contribution", seq),
                          contribution_grid, staleness_edges, uses_edges),
        bias=when("bias", _holds(probes, "bias", grp), buffer_bias, staleness_edges))
    return Diagnosis(**fields, skipped=skipped)


def _as_json_nested(rec) -> dict:
    """A record as JSON-ready values, with nested ``Estimate`` records as dicts and NaN as
    None."""
    def plain(val):
        if isinstance(val, Estimate):
            return {k: plain(x) for k, x in val.to_dict().items()}
        if isinstance(val, dict):
            return {k: plain(x) for k, x in val.items()}
        if isinstance(val, (list, tuple)):
            return [plain(x) for x in val]
        if isinstance(val, np.ndarray):
            return plain(val.tolist())
        if isinstance(val, float) and math.isnan(val):
            return None
        return val
    return {k: plain(val) for k, val in rec.__dict__.items()}


__all__ = ["Estimate", "NoiseRegression", "Grid", "SelfCorrelation", "BufferBias", "Diagnosis",
           "noise_regression", "noise_grid", "self_correlation", "contribution_grid",
           "buffer_bias", "diagnose", "STALENESS_EDGES", "USES_EDGES"]
